/*
 * listener: the node's listening socket, and what it does when the process
 * runs out of file descriptors.
 *
 * libuv's own accept loop (uv_listen) handles EMFILE by itself and says
 * nothing: it closes every pending connection, health checks included,
 * with a spare descriptor it keeps, and should that spare be lost (another
 * thread took the descriptor), it calls back with the error in a loop that
 * does not return until a descriptor frees up. So the node accepts by
 * itself, from a uv_poll_t on a socket it made:
 *
 *   - up to LISTENER_ACCEPT_BATCH connections per readable event, handed to
 *     the owner's on_conn callback;
 *   - on EMFILE or ENFILE, the owner's reclaim callback is asked first to
 *     close connections that hold a descriptor for nothing (idle HTTP
 *     connections, answered ones lingering after their FIN: net/conn.h),
 *     and accepting goes on;
 *   - when nothing can be reclaimed: the classic spare-descriptor trick (a
 *     descriptor on /dev/null is kept open; it is closed, the pending
 *     connections are accepted and closed at once, so their clients learn
 *     now rather than at their connect timeout, and the spare is opened
 *     again), then accepting pauses for LISTENER_PAUSE_MS, so a full
 *     descriptor table never spins the loop;
 *   - other accept errors (ENOBUFS, ENOMEM, ...) pause it too.
 *
 * Every failed accept() counts in converger_accept_errors_total{reason},
 * every connection closed for want of a descriptor in
 * converger_fd_limit_closed_total{kind}; one warning line per second at
 * most says how many of each since the last one.
 *
 * Loop thread only. The listener_t is embedded in its owner (node_t) and
 * holds every piece of its state.
 */
#ifndef CONVERGER_NET_LISTENER_H
#define CONVERGER_NET_LISTENER_H

#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "core/metrics.h"

#define LISTENER_ACCEPT_BATCH 128  /* accept() calls per readable event */
#define LISTENER_PAUSE_MS     100  /* accepting rests this long after an error it cannot relieve */
#define LISTENER_REPORT_MS    1000 /* at most one warning line per this many ms */

typedef struct listener_s listener_t;

/* A new connection: `fd` is a connected, non-blocking, close-on-exec TCP
 * socket, owned by the callee from now on (it must close it). */
typedef void (*listener_conn_cb)(listener_t *l, int fd);

/* The process is out of descriptors: close connections that can be spared
 * and return how many were closed (0: none). May be NULL. */
typedef int (*listener_reclaim_cb)(listener_t *l);

struct listener_s {
  uv_loop_t *loop;
  uv_poll_t poll;         /* readable: connections are pending */
  uv_timer_t pause_timer; /* ends a pause */
  int fd;                 /* listening socket; -1 when stopped */
  int spare_fd;           /* /dev/null, given up to refuse at the limit; -1: none */
  int started;            /* poll and timer initialised (listener_stop closes them) */
  int paused;
  listener_conn_cb on_conn;
  listener_reclaim_cb reclaim;
  metrics_t *metrics; /* borrowed: where the counters above go; NULL: nowhere */
  void *data;         /* the owner's */

  /* for the next warning line */
  uint64_t report_ms;                        /* monotonic ms of the last line; 0: none yet */
  uint64_t n_errors, n_reclaimed, n_refused; /* since that line */
  int last_errno;                            /* of the last failed accept() */
};

/* Bind a TCP socket to `addr` (sockaddr_in or sockaddr_in6, SO_REUSEADDR),
 * listen with `backlog` and start accepting. `on_conn` gets every new
 * connection; `reclaim` (may be NULL) is asked for descriptors at the
 * limit; the counters go to `metrics` (borrowed, may be NULL). Returns 0,
 * or a negative errno (nothing is left open then). */
int listener_start(listener_t *l, uv_loop_t *loop, const struct sockaddr *addr, int backlog,
                   listener_conn_cb on_conn, listener_reclaim_cb reclaim, metrics_t *metrics,
                   void *data);

/* The bound port (host byte order), or a negative errno. */
int listener_port(const listener_t *l);

/* Called by the owner's tick with monotonic ms: writes the warning line for
 * errors counted since the last one, once LISTENER_REPORT_MS has passed. */
void listener_tick(listener_t *l, uint64_t now);

/* Stop accepting and close the socket, the spare and the handles
 * (idempotent). Pending connections are left to the kernel, which resets
 * them when the socket closes. */
void listener_stop(listener_t *l);

#endif
