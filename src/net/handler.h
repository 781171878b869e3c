/*
 * handler: the one way the transport (net/) calls the layers above it. The
 * node fills a conn_handler_t (node->net) before it listens; conn.c, http.c
 * and ws.c call nothing above them by name.
 */
#ifndef CONVERGER_NET_HANDLER_H
#define CONVERGER_NET_HANDLER_H

#include <stddef.h>
#include <stdint.h>

typedef struct conn_s conn_t;
typedef struct http_request_s http_request_t;

/* What the transport calls above it: the node installs it (node->net)
 * before it listens. net/ calls up only through this table. Every function
 * is required; each runs on the loop thread. */
typedef struct {
  /* A complete HTTP request on `c`, to be answered with http_respond*
   * (net/http.h), now or later. */
  void (*on_request)(void *ud, conn_t *c, http_request_t *req);
  /* `c` became a WebSocket: set up its session (c->session). Nonzero: it
   * could not; the connection is closed with 1011. */
  int (*on_upgrade)(void *ud, conn_t *c);
  /* One complete text message (`len` bytes, valid UTF-8). */
  void (*on_text)(void *ud, conn_t *c, const char *text, size_t len);
  /* A WebSocket's output went below CONN_LOW_WATER. */
  void (*on_writable)(void *ud, conn_t *c);
  /* Every tick, for each open WebSocket (`now`: monotonic ms). */
  void (*on_tick)(void *ud, conn_t *c, uint64_t now);
  /* `c` is closing (conn_close) or has sent its close frame (ws_close):
   * nothing more is admitted for it. Called once or more; idempotent. */
  void (*on_close)(void *ud, conn_t *c);
  /* `c` is being freed: release c->session. */
  void (*on_free)(void *ud, conn_t *c);
  /* The `id:` of a Server-Sent Events stream's event now (net/ws.h,
   * ws_start_sse): where the stream is, for the browser's Last-Event-ID.
   * NULL or "": none yet (no `id:` is written). Borrowed, valid until the
   * next call; read at once. */
  const char *(*sse_id)(void *ud, conn_t *c);
  void *ud;
} conn_handler_t;

#endif
