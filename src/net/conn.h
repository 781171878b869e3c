/*
 * conn: one accepted TCP connection, first HTTP/1.1 (http.c), possibly
 * upgraded to WebSocket (ws.c) with a protocol session (proto/session.c).
 *
 * Loop thread only. Output is appended to a per-connection buffer and
 * written once per loop turn (uv_check), so a fan-out to thousands of
 * sockets costs one write per socket per turn. Bytes queued are bounded:
 * a slow consumer past CONN_MAX_QUEUED is dropped.
 *
 * Lifetime: conn_close() marks the connection closing and calls uv_close;
 * memory is freed in the close callback once no pool job holds a reference
 * (conn_ref/conn_unref), never under a caller that still uses it.
 *
 * Reclaimable connections hold a descriptor for nothing owed: accepted and
 * not yet sending, idle between keep-alive requests, or answered and
 * lingering after their FIN. They are kept on a list in the order they
 * became so. When the process runs out of descriptors, the listener
 * (net/listener.h) closes the oldest of them to accept new connections:
 * a flood of silent sockets then cannot lock health checks out.
 *
 * TLS (net/tls.h), on the client listener when CONVERGER_TLS_CERT is set:
 * ciphertext read is decrypted before HTTP and WebSocket see it, and the
 * plaintext they queue in `out` is sealed into records once per flush, so
 * a fan-out still costs one write per socket per turn. Before the FIN, a
 * TLS connection sends close_notify.
 */
#ifndef CONVERGER_NET_CONN_H
#define CONVERGER_NET_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "core/config.h"
#include "core/metrics.h"
#include "net/handler.h"
#include "net/listener.h"
#include "net/tls.h"

#define CONN_MAX_QUEUED       (8u << 20)   /* bytes of unsent output before dropping */
#define CONN_CLOSE_TIMEOUT_MS 5000         /* longest wait for output after a close */
#define CONN_LOW_WATER        (256u << 10) /* output below this: session_on_writable */
#define CONN_RECLAIM_BATCH    32           /* most connections reclaimed per call */

typedef struct http_s http_t;
typedef struct ws_s ws_t;
typedef struct session_s session_t;
typedef struct ws_encoder_s ws_encoder_t;

typedef enum { CONN_HTTP = 0, CONN_WS = 1 } conn_mode_t;

/* The transport of one node: its listener, its connections and what it
 * calls above it. Embedded in its owner (node_t); loop thread only. */
typedef struct net_s {
  uv_loop_t *loop;
  config_t
      *cfg; /* borrowed: listen address (conn_listen writes a chosen port back), times, sizes */
  conn_handler_t handler;    /* what the transport calls up (net/handler.h) */
  metrics_t *metrics;        /* borrowed: the node's registry (core/metrics.h); NULL: none */
  listener_t listener;       /* accepts connections (net/listener.h) */
  listener_t admin_listener; /* CONVERGER_ADMIN_LISTEN's, when set: its connections are c->admin */
  int admin_on;              /* admin_listener started */
  conn_t *conns;             /* every connection (doubly linked) */
  conn_t *dirty;             /* connections with queued output */
  int nconns;                /* all TCP connections */
  int nws;                   /* WebSocket connections */
  /* connections holding a descriptor for nothing owed, oldest first */
  conn_t *reclaim_head, *reclaim_tail;
  int nreclaimable;
  int stopping;          /* conn_stop_listening ran: answers close their connection */
  char read_buf[65536];  /* shared by every read: libuv reads one socket at a time */
  ws_encoder_t *encoder; /* the frame encoder every send shares (net/ws.c); NULL until used */
  tls_ctx_t *tls_ctx;    /* the client listener's certificate (net/tls.h); NULL: plain TCP */
  /* Write and shutdown requests done with, kept for the next (conn_t.req):
   * a fan-out that fills sockets reuses them instead of allocating one per
   * write. At most CONN_SPARE_REQS; freed by conn_net_free. */
  union conn_req_u *spare_reqs;
  int nspare_reqs;
} net_t;

/* Set up `net` on `loop` with `cfg` (borrowed), `handler` (copied; every
 * function required) and `metrics` (borrowed, may be NULL: nothing is
 * recorded; it must outlive the net). Nothing listens before conn_listen. */
void conn_net_init(net_t *net, uv_loop_t *loop, config_t *cfg, const conn_handler_t *handler,
                   metrics_t *metrics);

/* Load cfg->tls_cert and cfg->tls_key (when set) as the certificate new
 * client connections are served with; connections already open keep
 * theirs. Called by conn_listen, and by serve.c on SIGHUP and when either
 * file changes (the stamp of gate/keys.h, checked every tick). Returns 0 (also
 * when TLS is not configured), or -1 after logging the file and OpenSSL's
 * reason: the certificate in use, if any, stays. Loop thread. */
int conn_tls_reload(net_t *net, const char *why);

/* Free what `net` itself holds (the shared WebSocket encoder), once its
 * loop has ended and every connection is freed; `net` may be set up again
 * with conn_net_init. Loop thread. */
void conn_net_free(net_t *net);

/* Called once the connection no longer needs bytes it was given with
 * conn_write_shared (written, copied or dropped). Loop thread. */
typedef void (*conn_release_cb)(void *ud);

/* One piece of queued output (net/conn.c): a chunk the connection owns,
 * into which small writes are copied, or a reference to bytes many
 * connections share (one encoded frame for every subscriber). */
typedef struct {
  const char *p;           /* the next byte to write */
  conn_release_cb release; /* shared bytes: called with `ud` once written or dropped;
                              NULL: an owned chunk */
  union {                  /* one or the other: a burst queues one segment per
                              message on every subscriber, so each byte here counts */
    char *own;             /* the owned chunk (release NULL), freed once written */
    void *ud;              /* shared bytes: release's argument */
  };
  uint32_t len;  /* bytes left to write */
  uint32_t room; /* owned chunk: bytes free after p + len */
} conn_seg_t;

struct conn_s {
  uv_tcp_t tcp;
  net_t *net;
  conn_t *prev, *next; /* net->conns */
  conn_t *dirty_next;  /* net->dirty */
  conn_mode_t mode;
  unsigned closing : 1;       /* uv_close called or pending */
  unsigned handle_closed : 1; /* close callback ran */
  unsigned dirty : 1;
  unsigned writing : 1;
  unsigned reading : 1;
  unsigned shutdown_after_write : 1; /* half-close once output is flushed */
  unsigned shut : 1;                 /* uv_shutdown issued */
  unsigned closed_by_us : 1;         /* the node sent the first close frame (ws_close) */
  unsigned reclaimable : 1;          /* on net->reclaim_head's list */
  unsigned admin : 1;                /* accepted on the admin listener (api/rest.c routes by it) */
  unsigned tls_notified : 1;         /* close_notify queued before the FIN */
  unsigned tls_counted : 1;          /* its handshake is in converger_tls_handshakes_total */
  unsigned ws_frames : 1;            /* ws.c: an open WebSocket, not a stream, its close not queued
                                        (ws_takes_frames) */
  unsigned client_tls : 1;           /* ws.c, at the upgrade: the client reached the node over TLS
                                        (wss, https): TLS on our listener, or a proxy's that said
                                        so (X-Forwarded-Proto); gate/drain.c offers it wss peers
                                        only */
  int refs;                          /* pool jobs holding this conn */
  uint64_t last_rx_ms;               /* monotonic ms of the last bytes read */
  uint64_t deadline_ms;              /* monotonic ms; 0 = none (phase timeout) */
  uint64_t next_ping_ms;             /* WebSocket heartbeat */
  uint64_t close_deadline_ms;        /* monotonic ms: closed by then, flushed or not */
  uint64_t tls_start_ms;             /* monotonic ms of the first TLS bytes; 0 before */
  conn_t *reclaim_prev, *reclaim_next; /* net->reclaim_head */

  /* Queued output: segs[0 .. nsegs), of which the first nflight are
   * being written (uv_write); the array is freed whenever it empties, so
   * an idle connection holds no output memory. */
  conn_seg_t *segs;
  uint32_t nsegs, scap, nflight;
  size_t out_len; /* bytes waiting, not yet handed to a write */
  size_t wlen;    /* bytes being written */
  /* The write or the shutdown in flight (`writing`; one at a time), made
   * when it starts and freed by its callback: an idle connection, and one
   * whose writes all fit the socket (uv_try_write), holds none. */
  union conn_req_u *req;

  http_t *http;       /* HTTP phase state; NULL after upgrade */
  ws_t *ws;           /* WebSocket state; NULL before upgrade */
  session_t *session; /* protocol session; NULL before upgrade */
  tls_t *tls;         /* TLS state on a TLS listener; NULL: plain TCP. out holds plaintext */
};

/* Start listening on cfg->listen_host:listen_port (net/listener.h), and
 * on cfg->admin_host:admin_port when it is set (its connections are marked
 * admin); with port 0, cfg->listen and listen_port (admin_listen and
 * admin_port) get the port chosen. Returns 0 or a
 * negative errno after logging it. */
int conn_listen(net_t *net);

/* Make a connection of the connected stream socket `fd` (ownership passes
 * to the connection, which closes it): an HTTP connection, reading, with
 * the header timeout running. The listener calls it for every accepted
 * socket; tests and fuzz targets call it with one end of a socketpair(2)
 * to drive the real HTTP and WebSocket layers without a network. Returns
 * the connection, or NULL when it could not be set up (fd is closed; a
 * half-made connection is freed on the loop's next turn). Loop thread. */
conn_t *conn_adopt(net_t *net, int fd);

/* Stop accepting new connections, and from now on close each HTTP
 * connection after its answer instead of keeping it alive: the node is
 * stopping (idempotent). */
void conn_stop_listening(net_t *net);

/* Queue `len` bytes of output (copied). Returns 0, or -ENOBUFS after
 * dropping a slow consumer (the connection is then closing). */
int conn_write(conn_t *c, const void *data, size_t len);

/* Queue `len` bytes of output by reference, not copied: `data` stays
 * valid until `release(ud)` (not NULL), which the connection calls exactly
 * once, when the bytes are written, dropped (close), or copied (TLS, which
 * seals them into records of its own, and writes under CONN_SHARED_MIN
 * bytes, cheaper copied than referenced). The caller hands over one
 * reference of its own with the call, also when it fails. Many
 * connections write the same frame this way: one copy of it in memory,
 * written with writev(2) among the connection's other output. When
 * FLUSH_IOV (64) segments wait and no write is in flight, the call writes
 * them at once (net/conn.c): `release` of those bytes, this call's
 * included, may then run before it returns, and a socket error closes the
 * connection (conn_close) with 0 returned, as a failed write at the turn's
 * flush would. Returns 0, or -ENOBUFS after dropping a slow consumer, or
 * -ENOMEM (closed). Loop thread. */
#define CONN_SHARED_MIN 128
int conn_write_shared(conn_t *c, const void *data, size_t len, conn_release_cb release, void *ud);

/* Bytes queued or being written. */
size_t conn_pending_bytes(const conn_t *c);

/* Flush what is queued, then half-close (FIN) and close when the peer
 * closes or after 2 s; a peer that does not read is cut off after
 * CONN_CLOSE_TIMEOUT_MS in any case. Used after an HTTP error or
 * Connection: close, and after a WebSocket close frame. */
void conn_shutdown(conn_t *c);

/* Close now (queued output is dropped). Idempotent. */
void conn_close(conn_t *c);

/* Mark `c` reclaimable (1: appended to the list, if not on it) or not (0).
 * HTTP calls it as requests begin and end; conn itself on accept, on the
 * half-close after the last answer and on close. */
void conn_set_reclaimable(conn_t *c, int reclaimable);

/* Out of descriptors: close up to max(1, min(CONN_RECLAIM_BATCH, an eighth
 * of the list)) reclaimable connections, oldest first (nginx's
 * ngx_drain_connections): one that lingers after its answer, or an idle one
 * with no bytes waiting to be read (those are a request arriving); none
 * with output still queued. Returns how many were closed (their
 * descriptors are free on return). Loop thread. */
int conn_reclaim(net_t *net);

/* Stop/restart reading (HTTP pipelining waits for the current response). */
void conn_pause_reading(conn_t *c);
void conn_resume_reading(conn_t *c);

/* Keep `c` allocated across a pool job; conn_unref returns 1 when the
 * connection is still open (the caller may use it), 0 when it has closed
 * (the caller must not touch it again; it may have been freed). */
void conn_ref(conn_t *c);
int conn_unref(conn_t *c);

/* Write every dirty connection's queued output (called from uv_check). */
void conn_flush_all(net_t *net);

/* Per-tick deadline checks for every connection (header/hello timeouts,
 * heartbeat). `now` is monotonic ms. */
void conn_tick(net_t *net, uint64_t now);

#endif
