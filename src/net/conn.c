/*
 * conn.c: accept, read, buffered write, shutdown and deferred free.
 */
#include "net/conn.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/metrics.h"
#include "core/log.h"
#include "common/util.h"
#include "net/http.h"
#include "net/ws.h"

#define SHUTDOWN_LINGER_MS 2000
#define FLUSH_IOV          64 /* segments per writev(2) */

static int write_out(conn_t *c);

/* ---- queued output ---------------------------------------------------------- */

static void seg_release(conn_seg_t *s) {
  if (s->release)
    s->release(s->ud);
  else
    free(s->own);
}

/* Release segs[from .. to) and close the gap they leave. */
static void segs_release(conn_t *c, uint32_t from, uint32_t to) {
  if (to <= from) return;
  for (uint32_t i = from; i < to; i++) seg_release(&c->segs[i]);
  if (c->nsegs > to) memmove(c->segs + from, c->segs + to, (c->nsegs - to) * sizeof *c->segs);
  c->nsegs -= to - from;
  if (c->nsegs == 0) { /* idle connections hold no output memory */
    free(c->segs);
    c->segs = NULL;
    c->scap = 0;
  }
}

/* A new segment at the end, or NULL when out of memory. */
static conn_seg_t *seg_push(conn_t *c) {
  if (c->nsegs == c->scap) {
    uint32_t cap = c->scap ? c->scap * 2 : 4;
    conn_seg_t *v = realloc(c->segs, cap * sizeof *v);
    if (!v) return NULL;
    c->segs = v;
    c->scap = cap;
  }
  conn_seg_t *s = &c->segs[c->nsegs++];
  memset(s, 0, sizeof *s);
  return s;
}

/* Copy `len` bytes to the end of the waiting output: into the last owned
 * chunk when it has room (and is not being written), else into a new one
 * of at least OWN_CHUNK_MIN bytes, twice the last one's up to
 * OWN_CHUNK_MAX. 0, or -ENOMEM. */
#define OWN_CHUNK_MIN 1024
#define OWN_CHUNK_MAX (64u << 10)
static int append_copy(conn_t *c, const void *data, size_t len) {
  conn_seg_t *last = c->nsegs > c->nflight ? &c->segs[c->nsegs - 1] : NULL;
  if (last && !last->release && last->room >= len) {
    memcpy((char *)last->p + last->len, data, len);
    last->len += (uint32_t)len;
    last->room -= (uint32_t)len;
    return 0;
  }
  size_t cap = OWN_CHUNK_MIN;
  if (last && !last->release) {
    size_t prev = (size_t)(last->p - last->own) + last->len + last->room;
    cap = prev * 2 > OWN_CHUNK_MAX ? OWN_CHUNK_MAX : prev * 2;
  }
  if (cap < len) cap = len;
  char *own = malloc(cap);
  conn_seg_t *s = own ? seg_push(c) : NULL;
  if (!s) {
    free(own);
    return -ENOMEM;
  }
  memcpy(own, data, len);
  s->own = own;
  s->p = own;
  s->len = (uint32_t)len;
  s->room = (uint32_t)(cap - len);
  return 0;
}

/* `n` bytes of the first segments were written: release what is done,
 * advance into the one partly written. Not for segments in flight. */
static void consume(conn_t *c, size_t n) {
  uint32_t done = 0;
  while (n > 0 && done < c->nsegs) {
    conn_seg_t *s = &c->segs[done];
    if (n < s->len) {
      s->p += n;
      s->len -= (uint32_t)n;
      s->room = 0; /* a partly written chunk takes no more */
      break;
    }
    n -= s->len;
    done++;
  }
  if (done) segs_release(c, 0, done);
}

/* conn_t.req: a write's or a shutdown's request (data: the connection);
 * on net->spare_reqs, `next` links it. */
union conn_req_u {
  uv_write_t w;
  uv_shutdown_t s;
  union conn_req_u *next;
};

static void free_conn(conn_t *c) {
  net_t *net = c->net;
  conn_set_reclaimable(c, 0);
  if (c->prev)
    c->prev->next = c->next;
  else
    net->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  net->nconns--;
  if (c->mode == CONN_WS) {
    net->nws--;
    metrics_set(net->metrics, "converger_connections", NULL, net->nws);
  }
  /* Remove from the dirty list if present. */
  if (c->dirty)
    for (conn_t **p = &net->dirty; *p; p = &(*p)->dirty_next)
      if (*p == c) {
        *p = c->dirty_next;
        break;
      }
  net->handler.on_free(net->handler.ud, c);
  ws_free(c->ws);
  http_free(c->http);
  tls_free(c->tls);
  segs_release(c, 0, c->nsegs);
  free(c->segs);
  free(c);
}

static void close_cb(uv_handle_t *h) {
  conn_t *c = container_of((uv_tcp_t *)h, conn_t, tcp);
  c->handle_closed = 1;
  if (c->refs == 0 && !c->writing) free_conn(c);
}

void conn_set_reclaimable(conn_t *c, int reclaimable) {
  net_t *net = c->net;
  if (reclaimable == (int)c->reclaimable || (reclaimable && c->closing)) return;
  if (reclaimable) {
    c->reclaimable = 1;
    c->reclaim_next = NULL;
    c->reclaim_prev = net->reclaim_tail;
    if (net->reclaim_tail)
      net->reclaim_tail->reclaim_next = c;
    else
      net->reclaim_head = c;
    net->reclaim_tail = c;
    net->nreclaimable++;
    return;
  }
  if (c->reclaim_prev)
    c->reclaim_prev->reclaim_next = c->reclaim_next;
  else
    net->reclaim_head = c->reclaim_next;
  if (c->reclaim_next)
    c->reclaim_next->reclaim_prev = c->reclaim_prev;
  else
    net->reclaim_tail = c->reclaim_prev;
  c->reclaim_prev = c->reclaim_next = NULL;
  c->reclaimable = 0;
  net->nreclaimable--;
}

/* Bytes wait to be read: a request is arriving (a health check accepted a
 * moment ago, say), so the connection is not idle after all. */
static int has_input(conn_t *c) {
  uv_os_fd_t fd;
  char b;
  if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0) return 0;
  return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

int conn_reclaim(net_t *net) {
  int want = net->nreclaimable / 8;
  if (want > CONN_RECLAIM_BATCH) want = CONN_RECLAIM_BATCH;
  if (want < 1) want = 1;
  int closed = 0, looked = 0;
  /* Bounded: the list may start with connections still owed output. */
  for (conn_t *c = net->reclaim_head; c && closed < want && looked < 8 * CONN_RECLAIM_BATCH;
       looked++) {
    conn_t *next = c->reclaim_next;
    if (conn_pending_bytes(c) == 0 && (c->shut || !has_input(c))) {
      conn_close(c); /* the descriptor is closed now; the memory in close_cb */
      closed++;
    }
    c = next;
  }
  return closed;
}

static void count_tls_handshake(conn_t *c, const char *result);

void conn_close(conn_t *c) {
  if (c->closing) return;
  conn_set_reclaimable(c, 0);
  c->closing = 1;
  if (c->tls && c->tls_start_ms) count_tls_handshake(c, "abandoned"); /* once: no-op if counted */
  c->net->handler.on_close(c->net->handler.ud, c);
  /* The session leaves the bus now so no more frames are queued for it. */
  uv_close((uv_handle_t *)&c->tcp, close_cb);
}

void conn_ref(conn_t *c) { c->refs++; }

int conn_unref(conn_t *c) {
  c->refs--;
  if (c->closing) {
    if (c->refs == 0 && c->handle_closed && !c->writing) free_conn(c);
    return 0;
  }
  return 1;
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  conn_t *c = container_of((uv_tcp_t *)h, conn_t, tcp);
  buf->base = c->net->read_buf;
  buf->len = sizeof c->net->read_buf;
}

static void mark_dirty(conn_t *c) {
  if (c->dirty) return;
  c->dirty = 1;
  c->dirty_next = c->net->dirty;
  c->net->dirty = c;
}

/* Plaintext arrived: to HTTP, or after an upgrade to WebSocket. */
static void deliver(conn_t *c, const char *data, size_t len) {
  if (c->mode == CONN_HTTP)
    http_feed(c, data, len);
  else
    ws_feed(c, data, len);
}

static int stopped_reading(const conn_t *c) {
  return c->closing || c->shut || c->shutdown_after_write;
}

/* converger_tls_handshakes_total{result} and, for one that completed,
 * converger_tls_handshake_ms (first byte to Finished), once per
 * connection. */
static void count_tls_handshake(conn_t *c, const char *result) {
  if (c->tls_counted) return;
  c->tls_counted = 1;
  char labels[32];
  snprintf(labels, sizeof labels, "result=\"%s\"", result);
  metrics_add(c->net->metrics, "converger_tls_handshakes_total", labels, 1);
  if (strcmp(result, "ok") == 0)
    metrics_observe(c->net->metrics, "converger_tls_handshake_ms",
                    (double)(util_mono_ms() - c->tls_start_ms));
}

/* Ciphertext arrived on a TLS connection: run the handshake, deliver the
 * plaintext, and have whatever TLS wants to send (its handshake, an alert)
 * written on this loop turn. A first byte that cannot begin a TLS record
 * but begins an HTTP method is a plain request sent to the TLS port: it is
 * answered in plain HTTP, 400 with a JSON body that says so. */
static void tls_input(conn_t *c, const char *data, size_t len) {
  if (!c->tls_start_ms) {
    c->tls_start_ms = util_mono_ms();
    if (data[0] >= 'A' && data[0] <= 'Z') {
      tls_free(c->tls);
      c->tls = NULL;
      count_tls_handshake(c, "plain_http");
      http_fail(c, 400, "bad_request",
                "this port speaks TLS only: use https:// or wss:// (CONVERGER_TLS_CERT is set)");
      return;
    }
  }
  /* all of it first: the plaintext below lands in the same read_buf */
  if (tls_push(c->tls, data, len) != 0) {
    conn_close(c);
    return;
  }
  while (!stopped_reading(c)) {
    long n = tls_read(c->tls, c->net->read_buf, sizeof c->net->read_buf);
    if (tls_established(c->tls)) count_tls_handshake(c, "ok");
    if (n > 0) {
      deliver(c, c->net->read_buf, (size_t)n);
      continue;
    }
    if (n == TLS_AGAIN) break;
    if (n == TLS_FAILED) {
      if (!tls_established(c->tls)) count_tls_handshake(c, "failed");
      log_debug("tls: closing a connection: %s", tls_error(c->tls));
    }
    conn_shutdown(c); /* close_notify or failed: the alert, if any, then FIN */
    break;
  }
  if (!c->closing && c->tls && tls_pending(c->tls)) mark_dirty(c);
}

static void read_cb(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  conn_t *c = container_of((uv_tcp_t *)stream, conn_t, tcp);
  if (nread == 0) return;
  if (nread < 0) {
    conn_close(c);
    return;
  }
  c->last_rx_ms = util_mono_ms();
  if (stopped_reading(c)) return; /* closing: discard */
  if (c->tls)
    tls_input(c, buf->base, (size_t)nread);
  else
    deliver(c, buf->base, (size_t)nread);
}

void conn_pause_reading(conn_t *c) {
  if (c->reading && !c->closing) uv_read_stop((uv_stream_t *)&c->tcp);
  c->reading = 0;
}

void conn_resume_reading(conn_t *c) {
  if (c->reading || c->closing) return;
  if (uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb) == 0) c->reading = 1;
}

conn_t *conn_adopt(net_t *net, int fd) {
  conn_t *c = calloc(1, sizeof *c);
  if (!c) {
    close(fd);
    return NULL;
  }
  c->net = net;
  uv_tcp_init(net->loop, &c->tcp);
  c->next = net->conns; /* linked first, so free_conn can always unlink it */
  if (net->conns) net->conns->prev = c;
  net->conns = c;
  net->nconns++;
  if (uv_tcp_open(&c->tcp, fd) != 0) {
    close(fd);
    c->closing = 1;
    uv_close((uv_handle_t *)&c->tcp, close_cb);
    return NULL;
  }
  uv_tcp_nodelay(&c->tcp, 1); /* fails harmlessly on a socketpair */
  c->http = http_new(c);
  c->last_rx_ms = util_mono_ms();
  c->deadline_ms = c->last_rx_ms + (uint64_t)net->cfg->header_timeout_ms;
  if (!c->http) {
    conn_close(c);
    return NULL;
  }
  conn_set_reclaimable(c, 1); /* until its first request begins */
  conn_resume_reading(c);
  return c;
}

static void accept_cb(listener_t *l, int fd) {
  net_t *net = container_of(l, net_t, listener);
  conn_t *c = conn_adopt(net, fd);
  if (!c || !net->tls_ctx) return;
  c->tls = tls_new(net->tls_ctx);
  if (!c->tls) conn_close(c);
}

static void accept_admin_cb(listener_t *l, int fd) {
  conn_t *c = conn_adopt(container_of(l, net_t, admin_listener), fd);
  if (c) c->admin = 1;
}

void conn_net_init(net_t *net, uv_loop_t *loop, config_t *cfg, const conn_handler_t *handler,
                   metrics_t *metrics) {
  memset(net, 0, sizeof *net);
  net->loop = loop;
  net->cfg = cfg;
  net->handler = *handler;
  net->metrics = metrics;
}

void conn_net_free(net_t *net) {
  while (net->spare_reqs) {
    union conn_req_u *r = net->spare_reqs;
    net->spare_reqs = r->next;
    free(r);
  }
  net->nspare_reqs = 0;
  ws_encoder_free(net);
  tls_ctx_free(net->tls_ctx);
  net->tls_ctx = NULL;
}

int conn_tls_reload(net_t *net, const char *why) {
  const config_t *cfg = net->cfg;
  if (!cfg->tls_cert) return 0;
  char err[512];
  tls_ctx_t *ctx = tls_ctx_load(cfg->tls_cert, cfg->tls_key, err, sizeof err);
  if (!ctx) {
    log_error("%s: TLS certificate not loaded: %s%s", why, err,
              net->tls_ctx ? "; the one in use stays" : "");
    metrics_add(net->metrics, "converger_tls_reloads_total", "result=\"error\"", 1);
    return -1;
  }
  char what[400];
  tls_ctx_describe(ctx, what, sizeof what);
  log_info("%s: TLS on %s with %s (%s)", why, cfg->listen, cfg->tls_cert, what);
  tls_ctx_free(net->tls_ctx);
  net->tls_ctx = ctx;
  metrics_add(net->metrics, "converger_tls_reloads_total", "result=\"ok\"", 1);
  return 0;
}

static int reclaim_cb(listener_t *l) { return conn_reclaim(container_of(l, net_t, listener)); }

static int reclaim_admin_cb(listener_t *l) {
  return conn_reclaim(container_of(l, net_t, admin_listener));
}

/* Listen on host:port with `l`; with port 0, *text ("host:port") and *port
 * get the port chosen. `what` names it in the log. */
static int listen_on(net_t *net, listener_t *l, const char *what, const char *host, int *port,
                     char **text, listener_conn_cb on_conn, listener_reclaim_cb reclaim) {
  struct sockaddr_storage addr;
  int r = uv_ip4_addr(host, *port, (struct sockaddr_in *)&addr);
  if (r != 0) r = uv_ip6_addr(host, *port, (struct sockaddr_in6 *)&addr);
  if (r != 0) {
    log_error("%s: %s is not an IP address", what, host);
    return r;
  }
  r = listener_start(l, net->loop, (struct sockaddr *)&addr, 4096, on_conn, reclaim, net->metrics,
                     net);
  if (r != 0) {
    log_error("%s on %s: %s", what, *text, strerror(-r));
    return r;
  }
  if (*port == 0) { /* an ephemeral port: say which one */
    int chosen = listener_port(l);
    char buf[128];
    if (chosen > 0) {
      snprintf(buf, sizeof buf, addr.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", host, chosen);
      free(*text);
      *text = strdup(buf);
      *port = chosen;
    }
  }
  return 0;
}

int conn_listen(net_t *net) {
  config_t *cfg = net->cfg;
  if (!net->tls_ctx && conn_tls_reload(net, "start") != 0) return -EINVAL;
  int r = listen_on(net, &net->listener, "listen", cfg->listen_host, &cfg->listen_port,
                    &cfg->listen, accept_cb, reclaim_cb);
  if (r != 0 || !cfg->admin_host) return r;
  r = listen_on(net, &net->admin_listener, "admin listen", cfg->admin_host, &cfg->admin_port,
                &cfg->admin_listen, accept_admin_cb, reclaim_admin_cb);
  if (r != 0) {
    listener_stop(&net->listener);
    return r;
  }
  net->admin_on = 1;
  return 0;
}

void conn_stop_listening(net_t *net) {
  net->stopping = 1;
  listener_stop(&net->listener);
  if (net->admin_on) listener_stop(&net->admin_listener);
}

/* What conn_write and conn_write_shared check first: 0, or the error
 * after closing a slow consumer. */
static int write_room(conn_t *c, size_t len) {
  if (c->closing) return -EPIPE;
  if (c->out_len + len > CONN_MAX_QUEUED) {
    log_warn("closing a slow consumer: %zu bytes queued", c->out_len);
    conn_close(c);
    return -ENOBUFS;
  }
  return 0;
}

int conn_write(conn_t *c, const void *data, size_t len) {
  int r = write_room(c, len);
  if (r) return r;
  if (len == 0) return 0;
  if (append_copy(c, data, len) != 0) {
    conn_close(c);
    return -ENOMEM;
  }
  c->out_len += len;
  mark_dirty(c);
  return 0;
}

int conn_write_shared(conn_t *c, const void *data, size_t len, conn_release_cb release, void *ud) {
  if (c->tls || len < CONN_SHARED_MIN) {
    int r = conn_write(c, data, len);
    release(ud);
    return r;
  }
  int r = write_room(c, len);
  conn_seg_t *s = r == 0 ? seg_push(c) : NULL;
  if (!s) {
    release(ud);
    if (r == 0) conn_close(c);
    return r ? r : -ENOMEM;
  }
  s->p = data;
  s->len = (uint32_t)len;
  s->release = release;
  s->ud = ud;
  c->out_len += len;
  mark_dirty(c);
  /* A burst queues one segment per message on every subscriber before the
   * turn's flush, which writes FLUSH_IOV segments per writev(2) anyway:
   * writing each FLUSH_IOV as they come costs no more system calls, and
   * keeps the queue, and its array, that short while the socket takes
   * them. The turn's flush still runs what follows a write (the shutdown
   * after it, the writable callback): not from inside a fan-out. */
  if (c->nsegs >= FLUSH_IOV && !c->writing) write_out(c);
  return 0;
}

static void flush(conn_t *c);

#define CONN_SPARE_REQS 4096 /* requests kept for reuse: 4096 x 192 bytes at most */

/* The request of a write or shutdown about to start, a spare one when
 * there is one, or NULL (out of memory: the caller closes the
 * connection). */
static union conn_req_u *req_new(conn_t *c) {
  net_t *net = c->net;
  union conn_req_u *r = net->spare_reqs;
  if (r) {
    net->spare_reqs = r->next;
    net->nspare_reqs--;
  } else {
    r = malloc(sizeof *r);
  }
  if (r) c->req = r;
  return r;
}

/* Its callback ran: the request goes to the spares, or is freed. */
static void req_done(conn_t *c) {
  net_t *net = c->net;
  union conn_req_u *r = c->req;
  c->req = NULL;
  if (net->nspare_reqs >= CONN_SPARE_REQS) {
    free(r);
    return;
  }
  r->next = net->spare_reqs;
  net->spare_reqs = r;
  net->nspare_reqs++;
}

static void shutdown_cb(uv_shutdown_t *req, int status) {
  conn_t *c = req->data;
  req_done(c);
  c->writing = 0;
  if (status != 0) conn_close(c);
  if (c->closing && c->handle_closed && c->refs == 0) free_conn(c);
}

static void maybe_shutdown(conn_t *c) {
  if (!c->shutdown_after_write || c->shut || c->closing || c->out_len || c->writing) return;
  if (c->tls) {
    if (!c->tls_notified) {
      c->tls_notified = 1;
      tls_close_notify(c->tls);
    }
    if (tls_pending(c->tls)) { /* the close_notify (or an alert) goes before the FIN */
      flush(c);
      return;
    }
  }
  c->shut = 1;
  conn_set_reclaimable(c, 1); /* answered: the linger below is a courtesy */
  c->deadline_ms = util_mono_ms() + SHUTDOWN_LINGER_MS;
  conn_resume_reading(c); /* read (and discard) until the peer closes */
  union conn_req_u *r = req_new(c);
  if (r) r->s.data = c;
  if (r && uv_shutdown(&r->s, (uv_stream_t *)&c->tcp, shutdown_cb) == 0) {
    c->writing = 1;
  } else {
    if (r) req_done(c);
    conn_close(c);
  }
}

size_t conn_pending_bytes(const conn_t *c) { return c->out_len + (c->writing ? c->wlen : 0); }

/* Output drained below the low-water mark: replay may continue. */
static void writable(conn_t *c) {
  if (c->mode == CONN_WS && !c->closing && conn_pending_bytes(c) < CONN_LOW_WATER)
    c->net->handler.on_writable(c->net->handler.ud, c);
}

static void write_cb(uv_write_t *req, int status) {
  conn_t *c = req->data;
  req_done(c);
  c->writing = 0;
  c->wlen = 0;
  uint32_t flight = c->nflight;
  c->nflight = 0;
  segs_release(c, 0, flight); /* written, or dropped with the connection */
  if (c->closing) {
    if (c->handle_closed && c->refs == 0) free_conn(c);
    return;
  }
  if (status != 0) {
    conn_close(c);
    return;
  }
  if (c->out_len || (c->tls && tls_pending(c->tls))) /* TLS: records made while writing */
    flush(c);
  else
    maybe_shutdown(c);
  writable(c);
}

/* TLS: turn the plaintext waiting (every segment: TLS writes copy, and
 * nothing is in flight when this runs) into records, and the queue into
 * one segment of every ciphertext byte waiting (handshake and alerts
 * included, in order), TLS_CHUNK of plaintext at a time. Returns 0, or -1
 * when TLS refused or memory ran out (the connection is then closed). */
static int seal(conn_t *c) {
  size_t plen = c->out_len, waiting = tls_pending(c->tls);
  if (plen == 0 && waiting == 0) return 0;
  /* records add 22 bytes (TLS 1.3, AES-GCM) to each 16 KiB and less */
  size_t cap = waiting + plen + (plen / TLS_CHUNK + c->nsegs + 1) * 64, clen = 0;
  char *cipher = malloc(cap);
  if (!cipher) {
    conn_close(c);
    return -1;
  }
  uint32_t i = 0;
  size_t off = 0;
  do {
    size_t k = 0;
    if (i < c->nsegs) {
      conn_seg_t *s = &c->segs[i];
      k = s->len - off > TLS_CHUNK ? TLS_CHUNK : s->len - off;
      if (k && tls_seal(c->tls, s->p + off, k) != 0) {
        log_debug("tls: closing a connection: %s", tls_error(c->tls));
        free(cipher);
        conn_close(c);
        return -1;
      }
      if ((off += k) == s->len) i++, off = 0;
    }
    size_t n = tls_pending(c->tls);
    if (clen + n > cap) {
      char *p = realloc(cipher, clen + n);
      if (!p) {
        free(cipher);
        conn_close(c);
        return -1;
      }
      cipher = p;
      cap = clen + n;
    }
    clen += tls_take(c->tls, cipher + clen, n);
  } while (i < c->nsegs);
  segs_release(c, 0, c->nsegs);
  c->out_len = 0;
  if (clen == 0) {
    free(cipher);
    return 0;
  }
  conn_seg_t *s = seg_push(c);
  if (!s) {
    free(cipher);
    conn_close(c);
    return -1;
  }
  s->own = cipher;
  s->p = cipher;
  s->len = (uint32_t)clen;
  c->out_len = clen;
  return 0;
}

/* Write what waits: writev(2) of the segments, FLUSH_IOV at a time, while
 * the socket takes it all; what it does not take goes to uv_write (at
 * most FLUSH_IOV segments, in flight until write_cb), and output queued
 * meanwhile waits behind it. 1 when everything was written, 0 when a
 * write is in flight or the connection closed. Plain TCP: TLS seals
 * first (flush). */
static int write_out(conn_t *c) {
  uv_buf_t bufs[FLUSH_IOV];
  while (c->out_len > 0) {
    uint32_t k = c->nsegs < FLUSH_IOV ? c->nsegs : FLUSH_IOV;
    size_t total = 0;
    for (uint32_t i = 0; i < k; i++) {
      bufs[i] = uv_buf_init((char *)c->segs[i].p, c->segs[i].len);
      total += c->segs[i].len;
    }
    int n = uv_try_write((uv_stream_t *)&c->tcp, bufs, k);
    if (n < 0 && n != UV_EAGAIN) {
      conn_close(c);
      return 0;
    }
    size_t done = n > 0 ? (size_t)n : 0;
    c->out_len -= done;
    consume(c, done);
    if (done == total) continue;
    /* The socket is full: hand the rest of these segments to uv_write. */
    k = c->nsegs < FLUSH_IOV ? c->nsegs : FLUSH_IOV;
    total = 0;
    for (uint32_t i = 0; i < k; i++) {
      bufs[i] = uv_buf_init((char *)c->segs[i].p, c->segs[i].len);
      total += c->segs[i].len;
    }
    union conn_req_u *r = req_new(c);
    if (r) r->w.data = c;
    if (!r || uv_write(&r->w, (uv_stream_t *)&c->tcp, bufs, k, write_cb) != 0) {
      if (r) req_done(c);
      conn_close(c);
      return 0;
    }
    c->nflight = k;
    c->wlen = total;
    c->out_len -= total;
    c->writing = 1;
    return 0;
  }
  return 1;
}

/* Write what waits (write_out), then what follows a write: the shutdown
 * asked for after it, the writable callback. */
static void flush(conn_t *c) {
  if (c->closing || c->writing) return;
  if (c->tls && seal(c) != 0) return;
  if (!write_out(c)) return;
  maybe_shutdown(c);
  writable(c);
}

void conn_flush_all(net_t *net) {
  conn_t *c = net->dirty;
  net->dirty = NULL;
  while (c) {
    conn_t *next = c->dirty_next;
    c->dirty = 0;
    c->dirty_next = NULL;
    flush(c);
    c = next;
  }
}

void conn_shutdown(conn_t *c) {
  if (c->closing) return;
  c->shutdown_after_write = 1;
  if (!c->close_deadline_ms) c->close_deadline_ms = util_mono_ms() + CONN_CLOSE_TIMEOUT_MS;
  if (!c->dirty && !c->writing) maybe_shutdown(c);
}

void conn_tick(net_t *net, uint64_t now) {
  conn_t *c = net->conns;
  while (c) {
    conn_t *next = c->next;
    if (c->closing) {
      c = next;
      continue;
    }
    if (c->close_deadline_ms && now >= c->close_deadline_ms) {
      conn_close(c); /* the peer does not read what we still owe it */
    } else if (c->shut) {
      if (now >= c->deadline_ms) conn_close(c);
    } else if (c->mode == CONN_HTTP) {
      http_check_deadline(c, now);
    } else {
      net->handler.on_tick(net->handler.ud, c, now);
    }
    c = next;
  }
}
