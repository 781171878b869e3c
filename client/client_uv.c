/*
 * client_uv.c: the libconverger-client core driven over TCP on a libuv loop
 * (see include/converger/client.h).
 *
 * A client owns its core, one timer (the core's) and the transports the
 * core asked for. A transport goes
 *   RESOLVING (uv_getaddrinfo; skipped for IP literals) -> CONNECTING ->
 *   UPGRADING (the GET with a random Sec-WebSocket-Key is written; the
 *   answer is read with llhttp in response mode) -> OPEN (wslay in client
 *   mode, masks from OpenSSL's CSPRNG) -> closed.
 * A wss:// transport runs TLS (OpenSSL, TLS 1.2 or later) over memory BIOs
 * between CONNECTING and UPGRADING: the bytes read go into the SSL's read
 * BIO and come out of SSL_read as plaintext; plaintext (the upgrade, then
 * frames) waits in x->out until the handshake is done and goes through
 * SSL_write; whatever the SSL writes into its write BIO is handed to
 * libuv. The certificate is verified against the options' CAs (or the
 * system's), and its name against the URL's host, sent as SNI too.
 * The 101 must carry Upgrade: websocket, Connection: upgrade, the right
 * Sec-WebSocket-Accept (RFC 6455 section 4.1) and the subprotocol
 * converger.v1; anything else fails the attempt. A 503 answer is given to
 * the core as close 1013 with Retry-After as the hint.
 *
 * wslay glue as in the node (net/ws.c): callbacks only move bytes between
 * wslay and our buffers and say WOULDBLOCK when the input is used up;
 * proceed() writes what wslay has queued.
 *
 * Every event goes to the core, then pump() carries out the core's actions
 * until there are none. pump() does not nest: an event raised while it runs
 * (a connect that fails at once) is handled by the running loop.
 *
 * Lifetime: a transport is freed in its handle's close callback, once its
 * getaddrinfo request (if any) has also called back (`refs`). The client is
 * freed in the close callback of the last of its handles after
 * cvg_client_close. Loop thread only.
 */
#include <arpa/inet.h>
#include <llhttp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <wslay/wslay.h>

#include "converger/client.h"
#include "common/tlsclient.h"
#include "common/wskey.h"
#include "wsurl.h"

#define SUBPROTOCOL      "converger.v1"
#define MAX_FRAME_BYTES  (16u << 20) /* a server frame larger than this fails the transport */
#define MAX_QUEUED_BYTES (8u << 20)  /* unwritten output beyond this fails the transport */
#define CLOSE_LINGER_MS  2000        /* a closing transport's output may take this long */

typedef enum { X_RESOLVING, X_CONNECTING, X_UPGRADING, X_OPEN, X_CLOSING } xstate_t;

typedef struct xport_s xport_t;

struct cvg_client_s {
  uv_loop_t *loop;
  cvg_core_t *core;
  uv_timer_t timer;
  xport_t *xports; /* every transport whose handle is not closed yet */
  int handles;     /* open handles: the timer and each transport */
  int pumping;
  int closing;
  int started;
  SSL_CTX *tls; /* for wss:// URLs; NULL when there is none */
  void (*on_closed)(void *ud);
  void *closed_ud;
};

struct xport_s {
  xport_t *next;
  cvg_client_t *c;
  uint32_t id;
  xstate_t st;
  int refs;                   /* the tcp handle, one while getaddrinfo runs, one for close_timer */
  int gai_active;             /* the getaddrinfo request has not called back */
  int timer_on;               /* close_timer is initialised and not closed */
  uv_timer_t close_timer;     /* bounds the wait for the output of a closing transport */
  llhttp_settings_t settings; /* per transport: clients on several loops share nothing */
  int forgotten;              /* the core no longer knows it: report nothing */
  uv_tcp_t tcp;
  uv_connect_t creq;
  uv_getaddrinfo_t gai;
  wsurl_t url;     /* host, port and path of its URL */
  char accept[29]; /* the Sec-WebSocket-Accept we expect */
  llhttp_t http;
  char hfield[32]; /* the header being read: its name (truncated) */
  int hwhich;      /* 1 Upgrade, 2 Connection, 3 Accept, 4 Protocol, 5 Retry-After */
  char hval[6][128];
  int headers_done;
  wslay_event_context_ptr ws;
  const uint8_t *rbuf;
  size_t rlen;
  char *out; /* bytes wslay produced, not yet handed to uv_write */
  size_t olen, ocap;
  size_t queued;  /* bytes in uv_write requests not completed */
  int in_close;   /* the frame being read is a close frame */
  int close_seen; /* the server's close frame is complete (1), and answered (2) */
  int close_code; /* its code (1005: none) */
  uint8_t close_buf[125];
  size_t close_len;
  int close_after_write;
  SSL *ssl;     /* wss://: the TLS session over memory BIOs; NULL for ws:// */
  BIO *rbio;    /* bytes read from the socket, for SSL (owned by ssl) */
  BIO *wbio;    /* bytes SSL wrote, for the socket (owned by ssl) */
  int tls_done; /* the handshake is complete: x->out may go through SSL_write */
};

typedef struct {
  uv_write_t req;
  xport_t *x;
  size_t len;
  char data[];
} wreq_t;

static void pump(cvg_client_t *c);
static void xport_close(xport_t *x);

/* ---- reporting to the core -------------------------------------------------------- */

static int64_t now_ms(cvg_client_t *c) { return (int64_t)uv_now(c->loop); }

/* The transport failed or ended: tell the core (once) and close it. */
static void xport_lost(xport_t *x, int code, const char *reason) {
  if (!x->forgotten) {
    x->forgotten = 1;
    cvg_core_closed(x->c->core, x->id, code, reason, strlen(reason), now_ms(x->c));
  }
  xport_close(x);
  pump(x->c);
}

static void free_xport(xport_t *x) {
  cvg_client_t *c = x->c;
  for (xport_t **l = &c->xports; *l; l = &(*l)->next)
    if (*l == x) {
      *l = x->next;
      break;
    }
  if (x->ws) wslay_event_context_free(x->ws);
  if (x->ssl) SSL_free(x->ssl);
  free(x->out);
  free(x);
}

static void client_maybe_free(cvg_client_t *c) {
  if (!c->closing || c->handles > 0) return;
  void (*cb)(void *) = c->on_closed;
  void *ud = c->closed_ud;
  cvg_core_free(c->core);
  if (c->tls) SSL_CTX_free(c->tls);
  free(c);
  if (cb) cb(ud);
}

/* The close callback of each of a transport's handles (tcp, close_timer):
 * the last one frees it. */
static void on_xport_closed(uv_handle_t *h) {
  xport_t *x = h->data;
  cvg_client_t *c = x->c;
  c->handles--;
  if (--x->refs == 0) free_xport(x);
  client_maybe_free(c);
}

static void xport_close(xport_t *x) {
  if (x->st == X_CLOSING) return;
  x->st = X_CLOSING;
  if (x->gai_active) uv_cancel((uv_req_t *)&x->gai);
  if (x->timer_on) {
    x->timer_on = 0;
    uv_close((uv_handle_t *)&x->close_timer, on_xport_closed);
  }
  uv_close((uv_handle_t *)&x->tcp, on_xport_closed);
}

static void on_close_timer(uv_timer_t *t) {
  xport_close(t->data); /* the peer does not take what we still owe it */
}

/* After a close frame: the TCP connection ends once the output is written,
 * or after CLOSE_LINGER_MS if the peer stops reading. */
static void linger(xport_t *x) {
  x->close_after_write = 1;
  if (x->timer_on || x->st == X_CLOSING) return;
  uv_timer_init(x->c->loop, &x->close_timer);
  x->close_timer.data = x;
  x->timer_on = 1;
  x->refs++;
  x->c->handles++;
  uv_timer_start(&x->close_timer, on_close_timer, CLOSE_LINGER_MS, 0);
}

/* ---- writing ---------------------------------------------------------------------- */

static void on_written(uv_write_t *req, int status) {
  wreq_t *w = (wreq_t *)req; /* req is the first member */
  xport_t *x = w->x;
  x->queued -= w->len;
  free(w);
  if (x->st == X_CLOSING) return;
  if (status < 0) {
    char why[128];
    snprintf(why, sizeof why, "write: %s", uv_strerror(status));
    xport_lost(x, CVG_CLOSE_ABORT, why);
    return;
  }
  if (x->close_after_write && x->queued == 0 && x->olen == 0) xport_close(x);
}

/* Hand `len` bytes to libuv, as they go on the wire. 0, or -1 after
 * losing the transport. */
static int write_raw(xport_t *x, const char *data, size_t len) {
  if (x->queued + len > MAX_QUEUED_BYTES) {
    xport_lost(x, CVG_CLOSE_ABORT, "the server does not read: output over 8 MiB");
    return -1;
  }
  wreq_t *w = malloc(sizeof *w + len);
  if (!w) {
    xport_lost(x, CVG_CLOSE_ABORT, "out of memory");
    return -1;
  }
  w->x = x;
  w->len = len;
  memcpy(w->data, data, len);
  uv_buf_t b = uv_buf_init(w->data, (unsigned)w->len);
  int rc = uv_write(&w->req, (uv_stream_t *)&x->tcp, &b, 1, on_written);
  if (rc < 0) {
    free(w);
    char why[128];
    snprintf(why, sizeof why, "write: %s", uv_strerror(rc));
    xport_lost(x, CVG_CLOSE_ABORT, why);
    return -1;
  }
  x->queued += w->len;
  return 0;
}

/* TLS: what the SSL wrote into its write BIO, to the socket. */
static int tls_drain(xport_t *x) {
  char buf[16384];
  int n;
  while (x->st != X_CLOSING && (n = BIO_read(x->wbio, buf, sizeof buf)) > 0)
    if (write_raw(x, buf, (size_t)n) != 0) return -1;
  return x->st == X_CLOSING ? -1 : 0;
}

/* Hand the bytes gathered in x->out to libuv (through SSL_write for TLS,
 * once its handshake is done; until then they wait). */
static void flush_out(xport_t *x) {
  if (x->olen == 0 || x->st == X_CLOSING) return;
  if (!x->ssl) {
    size_t n = x->olen;
    x->olen = 0;
    write_raw(x, x->out, n);
    return;
  }
  if (!x->tls_done) return;
  if (x->queued + x->olen > MAX_QUEUED_BYTES) {
    x->olen = 0;
    xport_lost(x, CVG_CLOSE_ABORT, "the server does not read: output over 8 MiB");
    return;
  }
  /* memory BIOs take everything: SSL_write does not block or write part */
  if (SSL_write(x->ssl, x->out, (int)x->olen) != (int)x->olen) {
    x->olen = 0;
    xport_lost(x, CVG_CLOSE_ABORT, "TLS: write failed");
    return;
  }
  x->olen = 0;
  tls_drain(x);
}

static int out_append(xport_t *x, const void *data, size_t len) {
  if (x->olen + len > x->ocap) {
    size_t cap = x->ocap ? x->ocap : 4096;
    while (cap < x->olen + len) cap *= 2;
    char *o = realloc(x->out, cap);
    if (!o) return -1;
    x->out = o;
    x->ocap = cap;
  }
  memcpy(x->out + x->olen, data, len);
  x->olen += len;
  return 0;
}

/* ---- wslay glue ------------------------------------------------------------------- */

static ssize_t ws_recv_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags,
                          void *user) {
  xport_t *x = user;
  if (x->rlen == 0) {
    wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
    return -1;
  }
  size_t n = len < x->rlen ? len : x->rlen;
  memcpy(buf, x->rbuf, n);
  x->rbuf += n;
  x->rlen -= n;
  return (ssize_t)n;
}

static ssize_t ws_send_cb(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags,
                          void *user) {
  xport_t *x = user;
  if (out_append(x, data, len) != 0) {
    wslay_event_set_error(ctx, WSLAY_ERR_NOMEM);
    return -1;
  }
  return (ssize_t)len;
}

static int ws_genmask_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, void *user) {
  return RAND_bytes(buf, (int)len) == 1 ? 0 : -1; /* RFC 6455 section 5.3: unpredictable */
}

static void ws_msg_cb(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg,
                      void *user) {
  xport_t *x = user;
  if (x->forgotten) return;
  cvg_core_t *core = x->c->core;
  switch (arg->opcode) {
  case WSLAY_TEXT_FRAME:
    cvg_core_text(core, x->id, (const char *)arg->msg, arg->msg_length, now_ms(x->c));
    break;
  case WSLAY_PING: /* wslay queues the pong */
  case WSLAY_PONG:
    cvg_core_alive(core, x->id, now_ms(x->c));
    break;
  default: /* binary frames are not part of the protocol; close: see on_frame_end */
    break;
  }
}

/* The server's close frame is read here rather than from wslay, which
 * answers 1012 and 1013 (RFC 6455 section 7.4 and the IANA registry; the
 * codes of a restart and of overload) as a protocol error: wslay 1.1 knows
 * 1000-1011 only. */
static void on_frame_start(wslay_event_context_ptr ctx,
                           const struct wslay_event_on_frame_recv_start_arg *arg, void *user) {
  xport_t *x = user;
  x->in_close = arg->opcode == WSLAY_CONNECTION_CLOSE;
  x->close_len = 0;
}

static void on_frame_chunk(wslay_event_context_ptr ctx,
                           const struct wslay_event_on_frame_recv_chunk_arg *arg, void *user) {
  xport_t *x = user;
  if (!x->in_close) return;
  size_t room = sizeof x->close_buf - x->close_len;
  size_t n = arg->data_length < room ? arg->data_length : room;
  memcpy(x->close_buf + x->close_len, arg->data, n);
  x->close_len += n;
}

static void on_frame_end(wslay_event_context_ptr ctx, void *user) {
  xport_t *x = user;
  if (!x->in_close) return;
  x->in_close = 0;
  x->close_seen = 1;
  x->close_code = x->close_len >= 2 ? x->close_buf[0] << 8 | x->close_buf[1] : 1005;
}

static const struct wslay_event_callbacks ws_callbacks = {
    ws_recv_cb, ws_send_cb, ws_genmask_cb, on_frame_start, on_frame_chunk, on_frame_end, ws_msg_cb,
};

/* Answer the server's close frame with the same code (RFC 6455 section
 * 5.5.1), masked, without wslay (see on_frame_start). */
static void echo_close(xport_t *x) {
  uint8_t f[2 + 4 + 2] = {0x88, 0x80};
  size_t plen = x->close_code == 1005 ? 0 : 2;
  f[1] |= (uint8_t)plen;
  if (RAND_bytes(f + 2, 4) != 1) memset(f + 2, 0x5a, 4);
  uint8_t code[2] = {(uint8_t)(x->close_code >> 8), (uint8_t)x->close_code};
  for (size_t i = 0; i < plen; i++) f[6 + i] = code[i] ^ f[2 + i];
  if (out_append(x, f, 6 + plen) != 0) x->olen = 0;
}

/* Write what wslay queued; end the transport when the server closed. */
static void proceed(xport_t *x) {
  if (x->st != X_OPEN || x->close_seen == 2) return;
  if (x->close_seen) {
    x->close_seen = 2;                 /* handled */
    wslay_event_shutdown_write(x->ws); /* what it queued after the close stays unsent */
    echo_close(x);
    linger(x);
    flush_out(x);
    if (x->st == X_OPEN && x->queued == 0) xport_close(x);
    if (!x->forgotten) {
      x->forgotten = 1;
      cvg_core_closed(x->c->core, x->id, x->close_code,
                      x->close_len > 2 ? (const char *)x->close_buf + 2 : "",
                      x->close_len > 2 ? x->close_len - 2 : 0, now_ms(x->c));
      pump(x->c);
    }
    return;
  }
  if (wslay_event_want_write(x->ws) && wslay_event_send(x->ws) != 0) {
    xport_lost(x, CVG_CLOSE_ABORT, "out of memory");
    return;
  }
  flush_out(x);
}

/* Give `len` bytes of WebSocket frames to wslay. The frames become core
 * events in ws_msg_cb; their actions are carried out once wslay returns,
 * not from inside its callback. */
static void feed(xport_t *x, const char *data, size_t len) {
  x->rbuf = (const uint8_t *)data;
  x->rlen = len;
  int rc = wslay_event_recv(x->ws);
  pump(x->c);
  if (x->st != X_OPEN) return;
  if (!x->close_seen && (rc != 0 || !wslay_event_get_read_enabled(x->ws))) {
    /* wslay refused a frame (bad framing, a masked or oversized frame,
     * invalid UTF-8) and queued its close: send it, then end. */
    if (wslay_event_want_write(x->ws)) wslay_event_send(x->ws);
    flush_out(x);
    xport_lost(x, CVG_CLOSE_ABORT, "the server broke the WebSocket framing");
    return;
  }
  proceed(x);
}

/* ---- the upgrade answer ----------------------------------------------------------- */

enum { H_NONE, H_UPGRADE, H_CONNECTION, H_ACCEPT, H_PROTOCOL, H_RETRY_AFTER };

static int on_hfield(llhttp_t *p, const char *at, size_t len) {
  xport_t *x = p->data;
  size_t have = strlen(x->hfield);
  size_t n = len < sizeof x->hfield - 1 - have ? len : sizeof x->hfield - 1 - have;
  memcpy(x->hfield + have, at, n);
  x->hfield[have + n] = '\0';
  return 0;
}

static int on_hfield_done(llhttp_t *p) {
  xport_t *x = p->data;
  static const char *const names[] = {
      NULL,         "upgrade", "connection", "sec-websocket-accept", "sec-websocket-protocol",
      "retry-after"};
  x->hwhich = H_NONE;
  for (int i = 1; i <= H_RETRY_AFTER; i++)
    if (strcasecmp(x->hfield, names[i]) == 0) x->hwhich = i;
  x->hfield[0] = '\0';
  return 0;
}

static int on_hvalue(llhttp_t *p, const char *at, size_t len) {
  xport_t *x = p->data;
  if (x->hwhich == H_NONE) return 0;
  char *v = x->hval[x->hwhich];
  size_t have = strlen(v);
  size_t n = len < sizeof x->hval[0] - 1 - have ? len : sizeof x->hval[0] - 1 - have;
  memcpy(v + have, at, n);
  v[have + n] = '\0';
  return 0;
}

static int on_headers_done(llhttp_t *p) {
  ((xport_t *)p->data)->headers_done = 1;
  return 0;
}

/* The answer's headers are in: open the WebSocket, or fail the attempt.
 * `rest` are the bytes after the answer (already WebSocket frames). */
static void upgrade_answer(xport_t *x, const char *rest, size_t rest_len) {
  int status = llhttp_get_status_code(&x->http);
  char why[300];
  if (status == 503) {
    /* Overload: Retry-After (seconds) becomes the hint of a 1013. */
    long s = strtol(x->hval[H_RETRY_AFTER], NULL, 10);
    if (s < 0 || s > 3600) s = 0;
    snprintf(why, sizeof why, "{\"retryAfterMs\":%ld}", s * 1000);
    xport_lost(x, 1013, why);
    return;
  }
  const char *bad = NULL;
  if (status != 101)
    bad = "not 101";
  else if (!ws_has_token(x->hval[H_UPGRADE], "websocket"))
    bad = "no Upgrade: websocket";
  else if (!ws_has_token(x->hval[H_CONNECTION], "upgrade"))
    bad = "no Connection: upgrade";
  else if (strcmp(x->hval[H_ACCEPT], x->accept) != 0)
    bad = "wrong Sec-WebSocket-Accept";
  else if (strcmp(x->hval[H_PROTOCOL], SUBPROTOCOL) != 0)
    bad = "subprotocol converger.v1 not chosen";
  if (bad) {
    snprintf(why, sizeof why, "upgrade refused: HTTP %d (%s)", status, bad);
    xport_lost(x, CVG_CLOSE_ABORT, why);
    return;
  }
  if (wslay_event_context_client_init(&x->ws, &ws_callbacks, x) != 0) {
    xport_lost(x, CVG_CLOSE_ABORT, "out of memory");
    return;
  }
  wslay_event_config_set_max_recv_msg_length(x->ws, MAX_FRAME_BYTES);
  x->st = X_OPEN;
  cvg_core_opened(x->c->core, x->id, now_ms(x->c));
  pump(x->c);
  if (x->st == X_OPEN && rest_len > 0) feed(x, rest, rest_len);
}

/* ---- reading ---------------------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  static _Thread_local char rbuf[65536]; /* consumed before the next read */
  *buf = uv_buf_init(rbuf, sizeof rbuf);
}

/* `len` bytes of the HTTP answer and then WebSocket frames, as the server
 * sent them (decrypted, for TLS). */
static void on_plain(xport_t *x, const char *data, size_t len) {
  if (x->st == X_UPGRADING) {
    llhttp_errno_t e = llhttp_execute(&x->http, data, len);
    if (e == HPE_PAUSED_UPGRADE ||
        (e == HPE_OK && x->headers_done && llhttp_get_status_code(&x->http) != 101)) {
      size_t used = e == HPE_PAUSED_UPGRADE ? (size_t)(llhttp_get_error_pos(&x->http) - data) : len;
      upgrade_answer(x, data + used, len - used);
    } else if (e != HPE_OK) {
      char why[200];
      snprintf(why, sizeof why, "bad HTTP answer to the upgrade: %s",
               llhttp_get_error_reason(&x->http));
      xport_lost(x, CVG_CLOSE_ABORT, why);
    }
    return;
  }
  if (x->st != X_OPEN || x->close_seen) return; /* nothing counts after a close */
  feed(x, data, len);
}

/* Why the TLS handshake or a TLS read failed, for the close reason. */
static void tls_why(xport_t *x, const char *what, char *why, size_t len) {
  long v = SSL_get_verify_result(x->ssl);
  unsigned long e = ERR_peek_last_error();
  if (v != X509_V_OK)
    snprintf(why, len, "TLS: certificate verify failed for %s: %s", x->url.host,
             X509_verify_cert_error_string(v));
  else if (e)
    snprintf(why, len, "TLS: %s with %s:%s failed: %s", what, x->url.host, x->url.port,
             ERR_reason_error_string(e) ? ERR_reason_error_string(e) : "unknown error");
  else
    snprintf(why, len, "TLS: %s with %s:%s failed", what, x->url.host, x->url.port);
  ERR_clear_error();
}

/* TLS: `len` bytes from the socket into the SSL; the handshake's next
 * step, or the plaintext they make to on_plain. */
static void tls_read(xport_t *x, const char *data, size_t len) {
  static _Thread_local char plain[65536]; /* consumed by on_plain before the next read */
  char why[400];
  if (BIO_write(x->rbio, data, (int)len) != (int)len) {
    xport_lost(x, CVG_CLOSE_ABORT, "TLS: out of memory");
    return;
  }
  if (!x->tls_done) {
    int r = SSL_do_handshake(x->ssl);
    if (tls_drain(x) != 0) return;
    if (r != 1) {
      int e = SSL_get_error(x->ssl, r);
      if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return; /* more to come */
      tls_why(x, "handshake", why, sizeof why);
      xport_lost(x, CVG_CLOSE_ABORT, why);
      return;
    }
    x->tls_done = 1;
    flush_out(x); /* the upgrade request waited for it */
    if (x->st == X_CLOSING) return;
  }
  for (;;) {
    int n = SSL_read(x->ssl, plain, sizeof plain);
    if (n > 0) {
      on_plain(x, plain, (size_t)n);
      if (x->st == X_CLOSING) return;
      continue;
    }
    int e = SSL_get_error(x->ssl, n);
    if (e == SSL_ERROR_WANT_READ) break;
    if (e == SSL_ERROR_ZERO_RETURN) {
      xport_lost(x, CVG_CLOSE_ABORT, "the server closed the TLS session");
      return;
    }
    tls_why(x, "read", why, sizeof why);
    xport_lost(x, CVG_CLOSE_ABORT, why);
    return;
  }
  tls_drain(x); /* what reading made SSL write (a key update) */
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  xport_t *x = s->data;
  if (x->st == X_CLOSING || nread == 0) return;
  if (nread < 0) {
    char why[128];
    snprintf(why, sizeof why, "%s",
             nread == UV_EOF ? "the server closed the TCP connection" : uv_strerror((int)nread));
    xport_lost(x, CVG_CLOSE_ABORT, why);
    return;
  }
  if (x->ssl)
    tls_read(x, buf->base, (size_t)nread);
  else
    on_plain(x, buf->base, (size_t)nread);
}

/* TLS: a session for `x` (SNI and the name to verify: its URL's host),
 * and the ClientHello on its way. 0, or -1 after losing the transport. */
static int tls_begin(xport_t *x) {
  char why[400];
  x->ssl = SSL_new(x->c->tls);
  x->rbio = BIO_new(BIO_s_mem());
  x->wbio = BIO_new(BIO_s_mem());
  if (!x->ssl || !x->rbio || !x->wbio) {
    BIO_free(x->rbio);
    BIO_free(x->wbio);
    x->rbio = x->wbio = NULL;
    xport_lost(x, CVG_CLOSE_ABORT, "TLS: out of memory");
    return -1;
  }
  SSL_set_bio(x->ssl, x->rbio, x->wbio); /* owned by the SSL from now on */
  if (!tlsclient_expect_host(x->ssl, x->url.host)) {
    snprintf(why, sizeof why, "TLS: cannot verify the name %s", x->url.host);
    xport_lost(x, CVG_CLOSE_ABORT, why);
    return -1;
  }
  SSL_set_connect_state(x->ssl);
  int r = SSL_do_handshake(x->ssl);
  if (r != 1 && SSL_get_error(x->ssl, r) != SSL_ERROR_WANT_READ) {
    tls_why(x, "handshake", why, sizeof why);
    xport_lost(x, CVG_CLOSE_ABORT, why);
    return -1;
  }
  return tls_drain(x);
}

/* ---- connecting ------------------------------------------------------------------- */

static void on_connect(uv_connect_t *req, int status) {
  xport_t *x = req->data;
  if (x->st == X_CLOSING) return;
  if (status < 0) {
    char why[300];
    snprintf(why, sizeof why, "connect to %s:%s: %s", x->url.host, x->url.port,
             uv_strerror(status));
    xport_lost(x, CVG_CLOSE_ABORT, why);
    return;
  }
  uv_tcp_nodelay(&x->tcp, 1);
  unsigned char raw[16];
  char key[25];
  if (RAND_bytes(raw, sizeof raw) != 1) {
    xport_lost(x, CVG_CLOSE_ABORT, "no randomness for Sec-WebSocket-Key");
    return;
  }
  EVP_EncodeBlock((unsigned char *)key, raw, sizeof raw);
  ws_accept_key(key, x->accept);
  char host[300]; /* an IPv6 literal goes in brackets (RFC 7230 section 5.4) */
  snprintf(host, sizeof host, strchr(x->url.host, ':') ? "[%s]" : "%s", x->url.host);
  char req_text[2048];
  int n = snprintf(req_text, sizeof req_text,
                   "GET %s HTTP/1.1\r\nHost: %s:%s\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                   "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: " SUBPROTOCOL "\r\n"
                   "User-Agent: libconverger-client\r\n\r\n",
                   x->url.path, host, x->url.port, key);
  if (n < 0 || (size_t)n >= sizeof req_text || out_append(x, req_text, (size_t)n) != 0) {
    xport_lost(x, CVG_CLOSE_ABORT, "upgrade request too long");
    return;
  }
  llhttp_settings_init(&x->settings);
  x->settings.on_header_field = on_hfield;
  x->settings.on_header_field_complete = on_hfield_done;
  x->settings.on_header_value = on_hvalue;
  x->settings.on_headers_complete = on_headers_done;
  llhttp_init(&x->http, HTTP_RESPONSE, &x->settings);
  x->http.data = x;
  x->st = X_UPGRADING;
  int rc = uv_read_start((uv_stream_t *)&x->tcp, on_alloc, on_read);
  if (rc < 0) {
    xport_lost(x, CVG_CLOSE_ABORT, uv_strerror(rc));
    return;
  }
  if (x->url.tls && tls_begin(x) != 0) return;
  flush_out(x); /* with TLS: once the handshake is done */
}

static void start_connect(xport_t *x, const struct sockaddr *addr) {
  x->st = X_CONNECTING;
  x->creq.data = x;
  int rc = uv_tcp_connect(&x->creq, &x->tcp, addr, on_connect);
  if (rc < 0) {
    char why[300];
    snprintf(why, sizeof why, "connect to %s:%s: %s", x->url.host, x->url.port, uv_strerror(rc));
    xport_lost(x, CVG_CLOSE_ABORT, why);
  }
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  xport_t *x = req->data;
  cvg_client_t *c = x->c;
  x->refs--;
  x->gai_active = 0;
  c->handles--; /* the request counted as one */
  if (x->st == X_CLOSING) {
    uv_freeaddrinfo(res);
    if (x->refs == 0) free_xport(x);
    client_maybe_free(c);
    return;
  }
  if (status < 0 || !res) {
    char why[300];
    snprintf(why, sizeof why, "resolve %s: %s", x->url.host, uv_strerror(status));
    uv_freeaddrinfo(res);
    xport_lost(x, CVG_CLOSE_ABORT, why);
    return;
  }
  start_connect(x, res->ai_addr);
  uv_freeaddrinfo(res);
}

static void xport_open(cvg_client_t *c, uint32_t id, const char *url) {
  xport_t *x = calloc(1, sizeof *x);
  if (!x) {
    cvg_core_closed(c->core, id, CVG_CLOSE_ABORT, "out of memory", 13, now_ms(c));
    return;
  }
  x->c = c;
  x->id = id;
  x->refs = 1;
  uv_tcp_init(c->loop, &x->tcp);
  x->tcp.data = x;
  c->handles++;
  x->next = c->xports;
  c->xports = x;
  if (!wsurl_parse(url, &x->url, NULL, 0)) { /* never: the core checked it */
    xport_lost(x, CVG_CLOSE_ABORT, "bad URL");
    return;
  }
  struct sockaddr_storage ss;
  if (uv_ip4_addr(x->url.host, atoi(x->url.port), (struct sockaddr_in *)&ss) == 0 ||
      uv_ip6_addr(x->url.host, atoi(x->url.port), (struct sockaddr_in6 *)&ss) == 0) {
    start_connect(x, (struct sockaddr *)&ss);
    return;
  }
  x->st = X_RESOLVING;
  x->gai.data = x;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  x->refs++;
  x->gai_active = 1;
  c->handles++;
  int rc = uv_getaddrinfo(c->loop, &x->gai, on_resolved, x->url.host, x->url.port, &hints);
  if (rc < 0) {
    x->refs--;
    x->gai_active = 0;
    c->handles--;
    char why[300];
    snprintf(why, sizeof why, "resolve %s: %s", x->url.host, uv_strerror(rc));
    xport_lost(x, CVG_CLOSE_ABORT, why);
  }
}

/* ---- actions ---------------------------------------------------------------------- */

static xport_t *find_xport(cvg_client_t *c, uint32_t id) {
  for (xport_t *x = c->xports; x; x = x->next)
    if (x->id == id && !x->forgotten) return x;
  return NULL;
}

static void on_timer(uv_timer_t *t) {
  cvg_client_t *c = t->data;
  cvg_core_timer(c->core, now_ms(c));
  pump(c);
}

static void do_close(cvg_client_t *c, uint32_t id, int code, const char *reason) {
  xport_t *x = find_xport(c, id);
  if (!x) return;
  x->forgotten = 1;
  if (x->st != X_OPEN || code == CVG_CLOSE_ABORT) {
    xport_close(x);
    return;
  }
  size_t rl = strlen(reason);
  wslay_event_queue_close(x->ws, (uint16_t)code, (const uint8_t *)reason, rl > 123 ? 123 : rl);
  linger(x);
  proceed(x);
  if (x->st == X_OPEN && x->queued == 0 && x->olen == 0) xport_close(x);
}

static void do_send(cvg_client_t *c, uint32_t id, const char *data, size_t len) {
  xport_t *x = find_xport(c, id);
  if (!x || x->st != X_OPEN) return;
  struct wslay_event_msg m = {WSLAY_TEXT_FRAME, (const uint8_t *)data, len};
  int rc = wslay_event_queue_msg(x->ws, &m);
  if (rc == WSLAY_ERR_NO_MORE_MSG) return; /* a close is under way: its event follows */
  if (rc != 0) {
    xport_lost(x, CVG_CLOSE_ABORT, "out of memory");
    return;
  }
  proceed(x);
}

/* Carry out the core's actions until there are none. */
static void pump(cvg_client_t *c) {
  if (c->pumping) return;
  c->pumping = 1;
  cvg_action_t a;
  while (cvg_core_next_action(c->core, &a)) {
    switch (a.type) {
    case CVG_ACT_OPEN:
      xport_open(c, a.transport, a.url);
      break;
    case CVG_ACT_SEND:
      do_send(c, a.transport, a.data, a.len);
      break;
    case CVG_ACT_CLOSE:
      do_close(c, a.transport, a.code, a.reason);
      break;
    case CVG_ACT_TIMER:
      if (c->closing) break;
      if (a.at_ms < 0) {
        uv_timer_stop(&c->timer);
      } else {
        int64_t d = a.at_ms - now_ms(c);
        uv_timer_start(&c->timer, on_timer, d > 0 ? (uint64_t)d : 0, 0);
      }
      break;
    }
  }
  c->pumping = 0;
}

/* ---- public API ------------------------------------------------------------------- */

/* The TLS context of a client with wss:// URLs: TLS 1.2 or later, the
 * peer verified against the options' CAs or the system's. */
static int tls_context(const cvg_options_t *opt, SSL_CTX **out, char *err, size_t errlen) {
  SSL_CTX *ctx = tlsclient_ctx(opt->tls_ca_file, opt->tls_ca_dir);
  if (!ctx) {
    unsigned long e = ERR_get_error();
    if (err && errlen)
      snprintf(err, errlen, "TLS: cannot read the CA certificates %s%s%s: %s",
               opt->tls_ca_file ? opt->tls_ca_file : "",
               opt->tls_ca_file && opt->tls_ca_dir ? ", " : "",
               opt->tls_ca_dir ? opt->tls_ca_dir : (opt->tls_ca_file ? "" : "(the system's)"),
               ERR_reason_error_string(e) ? ERR_reason_error_string(e) : "unknown error");
    ERR_clear_error();
    return e ? CVG_EINVAL : CVG_ENOMEM;
  }
  SSL_CTX_set_mode(
      ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER); /* no partial writes: SSL_write takes all */
  *out = ctx;
  return 0;
}

int cvg_client_new(uv_loop_t *loop, const cvg_options_t *opt, cvg_client_t **out, char *err,
                   size_t errlen) {
  *out = NULL;
  if (!loop) {
    if (err && errlen) snprintf(err, errlen, "no loop");
    return CVG_EINVAL;
  }
  cvg_client_t *c = calloc(1, sizeof *c);
  if (!c) {
    if (err && errlen) snprintf(err, errlen, "out of memory");
    return CVG_ENOMEM;
  }
  int rc = cvg_core_new(opt, &c->core, err, errlen);
  if (rc != 0) {
    free(c);
    return rc;
  }
  int any_tls = 0;
  for (size_t i = 0; i < opt->nurls; i++) any_tls |= wsurl_tls(opt->urls[i]);
  if (any_tls && (rc = tls_context(opt, &c->tls, err, errlen)) != 0) {
    cvg_core_free(c->core);
    free(c);
    return rc;
  }
  c->loop = loop;
  uv_timer_init(loop, &c->timer);
  c->timer.data = c;
  c->handles = 1;
  *out = c;
  return 0;
}

int cvg_client_start(cvg_client_t *c) {
  if (c->started || c->closing) return CVG_ESTATE;
  c->started = 1;
  uv_update_time(c->loop);
  cvg_core_start(c->core, now_ms(c));
  pump(c);
  return 0;
}

int cvg_send(cvg_client_t *c, const char *conv, const char *id, const char *body, cvg_sent_cb cb,
             void *ud) {
  if (c->closing) return CVG_ESTATE;
  int rc = cvg_core_send(c->core, conv, id, body, cb, ud, now_ms(c));
  if (rc == 0) pump(c);
  return rc;
}

int cvg_subscribe(cvg_client_t *c, const char *conv, int64_t watermark, const char *epoch) {
  if (c->closing) return CVG_ESTATE;
  int rc = cvg_core_subscribe(c->core, conv, watermark, epoch, now_ms(c));
  if (rc == 0) pump(c);
  return rc;
}

int cvg_unsubscribe(cvg_client_t *c, const char *conv) {
  if (c->closing) return CVG_ESTATE;
  int rc = cvg_core_unsubscribe(c->core, conv, now_ms(c));
  if (rc == 0) pump(c);
  return rc;
}

int cvg_client_set_token(cvg_client_t *c, const char *token) {
  if (c->closing) return CVG_ESTATE;
  int rc = cvg_core_set_token(c->core, token, now_ms(c));
  if (rc == 0) pump(c);
  return rc;
}

const char *cvg_client_id(const cvg_client_t *c) { return cvg_core_client_id(c->core); }

void cvg_client_stats(const cvg_client_t *c, cvg_stats_t *out) {
  cvg_core_stats(c->core, (int64_t)uv_now(c->loop), out);
}

int64_t cvg_client_watermark(const cvg_client_t *c, const char *conv) {
  return cvg_core_watermark(c->core, conv);
}

const char *cvg_client_epoch(const cvg_client_t *c, const char *conv) {
  return cvg_core_epoch(c->core, conv);
}

static void on_timer_closed(uv_handle_t *h) {
  cvg_client_t *c = h->data;
  c->handles--;
  client_maybe_free(c);
}

void cvg_client_close(cvg_client_t *c, void (*on_closed)(void *ud), void *ud) {
  if (c->closing) return;
  c->closing = 1;
  c->on_closed = on_closed;
  c->closed_ud = ud;
  uv_timer_stop(&c->timer);
  cvg_core_stop(c->core, now_ms(c));
  pump(c);
  uv_close((uv_handle_t *)&c->timer, on_timer_closed);
}
