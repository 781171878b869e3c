/*
 * wsclient.c: connect, upgrade, masked client frames and in-place parsing
 * of server frames for the bench's WebSocket connections (see
 * bench/wsclient.h).
 */
#include "bench/wsclient.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/run.h"
#include "common/jitter.h"
#include "common/util.h"
#include "store/store.h"

#define OPEN_WINDOW 256        /* connections connecting or upgrading at once */
#define FRAME_MAX   (1u << 20) /* largest server frame accepted */
#define UPGRADE_MAX 8192       /* largest 101 answer accepted */

static const char *state_name(int s) {
  static const char *names[] = {"new", "connecting", "upgrading", "open", "lost"};
  return names[s];
}

static void ws_lost(wsc_t *c, const char *why) {
  bench_t *b = c->b;
  if (c->state == WSC_LOST) return;
  int was = c->state;
  c->state = WSC_LOST;
  uv_read_stop((uv_stream_t *)&c->tcp);
  if (!b->closing)
    run_fail(b, "%s: connection %u (%s): %s", b->phase, c->index, state_name(was), why);
}

static void send_frame(wsc_t *c, int opcode, const void *payload, size_t len) {
  uint8_t stack[4096];
  uint8_t *f = len + 14 <= sizeof stack ? stack : malloc(len + 14);
  if (!f) {
    run_fail(c->b, "out of memory");
    return;
  }
  size_t h = 0;
  f[h++] = (uint8_t)(0x80 | opcode); /* FIN */
  if (len < 126) {
    f[h++] = (uint8_t)(0x80 | len); /* MASK bit */
  } else if (len <= 0xffff) {
    f[h++] = 0x80 | 126;
    f[h++] = (uint8_t)(len >> 8);
    f[h++] = (uint8_t)len;
  } else {
    f[h++] = 0x80 | 127;
    for (int i = 7; i >= 0; i--) f[h++] = (uint8_t)((uint64_t)len >> (8 * i));
  }
  uint64_t r = jitter_next(&c->b->rng);
  uint8_t *mask = f + h;
  memcpy(mask, &r, 4);
  h += 4;
  const uint8_t *src = payload;
  for (size_t i = 0; i < len; i++) f[h + i] = src[i] ^ mask[i & 3];
  run_send(c->b, (uv_stream_t *)&c->tcp, (const char *)f, h + len);
  if (f != stack) free(f);
}

void wsc_send_hello(wsc_t *c) {
  bench_t *b = c->b;
  char conv[STORE_ID_MAX + 1], wm[24], text[4096];
  run_conv_name(b->fanout ? -1 : (int)(c->index % RUN_CONVS), conv);
  if (b->hello_conv) snprintf(conv, sizeof conv, "%s", b->hello_conv);
  if (b->hello_watermark < 0)
    snprintf(wm, sizeof wm, "null");
  else
    snprintf(wm, sizeof wm, "%lld", (long long)b->hello_watermark);
  int n =
      snprintf(text, sizeof text,
               "{\"type\":\"hello\",\"token\":\"%s\",\"subs\":[{\"conv\":\"%s\",\"watermark\":%s}],"
               "\"client\":\"converger-bench\"}",
               b->token, conv, wm);
  if (n < 0 || (size_t)n >= sizeof text) {
    run_fail(b, "the token is too long for a hello (%zu bytes)", strlen(b->token));
    return;
  }
  c->seq = b->hello_watermark;
  c->hello_ns = run_now_ns();
  send_frame(c, 0x1, text, (size_t)n);
}

/* Append to the connection's partial buffer (bounded by FRAME_MAX). */
static int partial_append(wsc_t *c, const uint8_t *p, size_t n) {
  if ((size_t)c->plen + n > FRAME_MAX + 16) {
    ws_lost(c, "a frame larger than 1 MiB");
    return -1;
  }
  if (c->plen + n > c->pcap) {
    size_t cap = c->pcap ? c->pcap : 256;
    while (cap < c->plen + n) cap *= 2;
    uint8_t *q = realloc(c->partial, cap);
    if (!q) {
      run_fail(c->b, "out of memory");
      return -1;
    }
    c->partial = q;
    c->pcap = (uint32_t)cap;
  }
  memcpy(c->partial + c->plen, p, n);
  c->plen += (uint32_t)n;
  return 0;
}

/* The header of the server frame at p: 1 with its size and payload length,
 * 0 when more bytes are needed, -1 masked (servers must not mask), -2 over
 * FRAME_MAX. */
static int frame_header(const uint8_t *p, size_t n, size_t *hdr, uint64_t *len) {
  if (n < 2) return 0;
  if (p[1] & 0x80) return -1;
  uint64_t l = p[1] & 0x7f;
  size_t h = l == 126 ? 4 : l == 127 ? 10 : 2;
  if (n < h) return 0;
  if (l == 126) {
    l = (uint64_t)p[2] << 8 | p[3];
  } else if (l == 127) {
    l = 0;
    for (int i = 2; i < 10; i++) l = l << 8 | p[i];
  }
  if (l > FRAME_MAX) return -2;
  *hdr = h;
  *len = l;
  return 1;
}

/* The integer after `key` in a frame (e.g. "\"seq\":"), or -2. */
static int64_t int_after(const char *p, size_t len, const char *key) {
  size_t kl = strlen(key);
  const char *k = memmem(p, len, key, kl);
  if (!k) return -2;
  const char *q = k + kl, *end = p + len;
  int64_t v = 0;
  int any = 0;
  for (; q < end && *q >= '0' && *q <= '9'; q++, any = 1) v = v * 10 + (*q - '0');
  return any ? v : -2;
}

static void on_text(wsc_t *c, const char *p, size_t len) {
  bench_t *b = c->b;
  const char *t = memmem(p, len, "\"type\":\"", 8);
  if (!t) {
    ws_lost(c, "a text frame without \"type\"");
    return;
  }
  t += 8;
  size_t rest = (size_t)(p + len - t);
#define IS_TYPE(s) (rest >= sizeof(s) && memcmp(t, s "\"", sizeof(s)) == 0)
  if (IS_TYPE("msg")) {
    int64_t seq = int_after(p, len, "\"seq\":");
    if (c->seq >= 0 && seq != c->seq + 1) b->seq_errors++;
    c->seq = seq;
    if (b->on_msg) b->on_msg(b, seq, p, len);
    if (++b->msgs == b->want_msgs) b->msgs_done_ns = run_now_ns();
    run_maybe_done(b);
  } else if (IS_TYPE("synced")) {
    int64_t head = int_after(p, len, "\"head\":");
    if (c->seq >= 0 && c->seq != head) b->seq_errors++; /* replay incomplete */
    c->seq = head;
    if (!c->synced) {
      c->synced = 1;
      b->nsynced++;
      if (b->lat && b->nlat < b->nws) b->lat[b->nlat++] = run_now_ns() - c->hello_ns;
    }
    run_maybe_done(b);
  } else if (IS_TYPE("error") || IS_TYPE("drain")) {
    char why[400];
    snprintf(why, sizeof why, "unexpected frame %.*s", (int)(len > 300 ? 300 : len), p);
    ws_lost(c, why);
  } /* welcome, pong, sent, unknown types: nothing to count */
#undef IS_TYPE
}

static void handle_frame(wsc_t *c, uint8_t b0, const uint8_t *payload, size_t len) {
  char why[200];
  switch (b0 & 0x0f) {
  case 0x1:
    if (!(b0 & 0x80)) {
      ws_lost(c, "a fragmented text frame (the node sends whole frames)");
      return;
    }
    on_text(c, (const char *)payload, len);
    return;
  case 0x9: /* ping: pong with the same payload */
    send_frame(c, 0xA, payload, len);
    return;
  case 0xA:
    return;
  case 0x8: {
    int code = len >= 2 ? payload[0] << 8 | payload[1] : 1005;
    int rlen = len > 2 ? (int)(len - 2 > 120 ? 120 : len - 2) : 0;
    snprintf(why, sizeof why, "closed by the node with %d \"%.*s\"", code, rlen,
             (const char *)payload + 2);
    ws_lost(c, why);
    return;
  }
  default:
    snprintf(why, sizeof why, "a frame with opcode %d", b0 & 0x0f);
    ws_lost(c, why);
  }
}

static int bad_header(wsc_t *c, int r) {
  ws_lost(c, r == -1 ? "a masked server frame" : "a frame larger than 1 MiB");
  return -1;
}

/* Parse server frames: first complete the one left in `partial` by an
 * earlier read, then the whole frames of this read in place; keep what is
 * left of the last one. */
static void frames_feed(wsc_t *c, const uint8_t *p, size_t n) {
  size_t hdr = 0;
  uint64_t len = 0;
  while (c->plen) {
    int r = frame_header(c->partial, c->plen, &hdr, &len);
    if (r < 0) {
      bad_header(c, r);
      return;
    }
    if (r == 1 && c->plen >= hdr + len) {
      size_t total = hdr + (size_t)len;
      handle_frame(c, c->partial[0], c->partial + hdr, (size_t)len);
      if (c->state != WSC_OPEN) return;
      memmove(c->partial, c->partial + total, c->plen - total);
      c->plen -= (uint32_t)total;
      continue;
    }
    if (n == 0) return;
    size_t want;
    if (r == 1)
      want = hdr + (size_t)len - c->plen;
    else if (c->plen < 2)
      want = 2 - c->plen;
    else
      want = (size_t)((c->partial[1] & 0x7f) == 126 ? 4 : 10) - c->plen;
    size_t take = want < n ? want : n;
    if (partial_append(c, p, take) != 0) return;
    p += take;
    n -= take;
  }
  while (n) {
    int r = frame_header(p, n, &hdr, &len);
    if (r < 0) {
      bad_header(c, r);
      return;
    }
    if (r == 0 || n - hdr < len) {
      partial_append(c, p, n);
      return;
    }
    handle_frame(c, p[0], p + hdr, (size_t)len);
    if (c->state != WSC_OPEN) return;
    p += hdr + len;
    n -= hdr + (size_t)len;
  }
}

static void on_open(wsc_t *c) {
  bench_t *b = c->b;
  c->state = WSC_OPEN;
  b->opening--;
  b->nopen++;
  if (b->auto_hello) wsc_send_hello(c);
  run_maybe_done(b);
}

/* Collect the answer to the upgrade; after its blank line the connection
 * is open and what followed it stays in `partial` for frames_feed. */
static void upgrade_feed(wsc_t *c, const uint8_t *p, size_t n) {
  if (partial_append(c, p, n) != 0) return;
  const uint8_t *end = memmem(c->partial, c->plen, "\r\n\r\n", 4);
  if (!end) {
    if (c->plen > UPGRADE_MAX) ws_lost(c, "an upgrade answer larger than 8 KiB");
    return;
  }
  if (c->plen < 12 || memcmp(c->partial, "HTTP/1.1 101", 12) != 0) {
    const uint8_t *eol = memmem(c->partial, c->plen, "\r\n", 2);
    char why[200];
    snprintf(why, sizeof why, "upgrade refused: %.*s",
             (int)(eol - c->partial > 150 ? 150 : eol - c->partial), (const char *)c->partial);
    ws_lost(c, why);
    return;
  }
  size_t head = (size_t)(end + 4 - c->partial);
  memmove(c->partial, c->partial + head, c->plen - head);
  c->plen -= (uint32_t)head;
  on_open(c);
  wsc_open_more(c->b);
}

static void ws_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  wsc_t *c = container_of((uv_tcp_t *)h, wsc_t, tcp);
  buf->base = c->b->read_buf;
  buf->len = sizeof c->b->read_buf;
}

static void ws_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  wsc_t *c = container_of((uv_tcp_t *)s, wsc_t, tcp);
  if (nread == 0) return;
  if (nread < 0) {
    ws_lost(c, nread == UV_EOF ? "the node closed the connection" : uv_strerror((int)nread));
    return;
  }
  if (c->state == WSC_UPGRADING) {
    upgrade_feed(c, (const uint8_t *)buf->base, (size_t)nread);
    if (c->state == WSC_OPEN && c->plen) frames_feed(c, NULL, 0);
    return;
  }
  if (c->state == WSC_OPEN) frames_feed(c, (const uint8_t *)buf->base, (size_t)nread);
}

static void ws_connect_cb(uv_connect_t *req, int status) {
  wsc_t *c = container_of(req, wsc_t, creq);
  bench_t *b = c->b;
  if (status == UV_ECANCELED || b->closing) return;
  if (status < 0) {
    ws_lost(c, uv_strerror(status));
    return;
  }
  c->state = WSC_UPGRADING;
  int r = uv_read_start((uv_stream_t *)&c->tcp, ws_alloc_cb, ws_read_cb);
  if (r != 0) {
    ws_lost(c, uv_strerror(r));
    return;
  }
  uint64_t k[2] = {jitter_next(&b->rng), jitter_next(&b->rng)};
  char key[32], text[512];
  EVP_EncodeBlock((unsigned char *)key, (const unsigned char *)k, 16); /* 24 chars, "==" */
  int n = snprintf(text, sizeof text,
                   "GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n"
                   "Sec-WebSocket-Protocol: converger.v1\r\n\r\n",
                   b->ws_port ? b->ws_port : b->port, key);
  run_send(b, (uv_stream_t *)&c->tcp, text, (size_t)n);
}

/* Start connections until OPEN_WINDOW are connecting or upgrading. */
void wsc_open_more(bench_t *b) {
  struct sockaddr_in addr;
  uv_ip4_addr("127.0.0.1", b->ws_port ? b->ws_port : b->port, &addr);
  while (!b->failed && b->opening < OPEN_WINDOW && b->next_open < b->nws) {
    wsc_t *c = &b->ws[b->next_open++];
    int r = uv_tcp_init(&b->loop, &c->tcp);
    if (r != 0) {
      run_fail(b, "%s: connection %u: %s", b->phase, c->index, uv_strerror(r));
      return;
    }
    c->handle = 1;
    b->handles++;
    c->state = WSC_CONNECTING;
    b->opening++;
    r = uv_tcp_connect(&c->creq, &c->tcp, (const struct sockaddr *)&addr, ws_connect_cb);
    if (r != 0) {
      ws_lost(c, uv_strerror(r));
      return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
  }
}

static void reset_counters(bench_t *b) {
  b->opening = b->nopen = b->nsynced = b->next_open = 0;
  b->msgs = b->seq_errors = 0;
  b->rest_connected = b->rest_answers = 0;
  b->want_open = b->want_synced = b->want_rest_connected = b->want_rest_answers = 0;
  b->want_msgs = 0;
  b->msgs_done_ns = b->rest_done_ns = b->done_ns = b->hold_until_ns = 0;
}

/* A new set of `n` connections (none opened yet: see wsc_open_more). */
int wsc_set_begin(bench_t *b, size_t n, int auto_hello, int fanout, int64_t watermark) {
  reset_counters(b);
  b->ws = calloc(n, sizeof *b->ws);
  if (!b->ws) {
    run_fail(b, "out of memory for %zu connections", n);
    return -1;
  }
  b->nws = n;
  b->auto_hello = auto_hello;
  b->fanout = fanout;
  b->hello_watermark = watermark;
  for (size_t i = 0; i < n; i++) {
    b->ws[i].b = b;
    b->ws[i].index = (uint32_t)i;
    b->ws[i].seq = -1;
  }
  return 0;
}

static void ws_close_cb(uv_handle_t *h) {
  wsc_t *c = container_of((uv_tcp_t *)h, wsc_t, tcp);
  c->b->handles--;
}

/* Close every connection of the set with RST (no close handshake, no
 * TIME_WAIT) and free it. */
void wsc_set_end(bench_t *b) {
  if (!b->ws) return;
  b->closing = 1;
  size_t left = b->handles;
  for (size_t i = 0; i < b->nws; i++) {
    wsc_t *c = &b->ws[i];
    if (!c->handle) continue;
    c->handle = 0;
    left--;
    if (uv_tcp_close_reset(&c->tcp, ws_close_cb) != 0)
      uv_close((uv_handle_t *)&c->tcp, ws_close_cb);
  }
  run_drain_closes(b, left);
  for (size_t i = 0; i < b->nws; i++) free(b->ws[i].partial);
  free(b->ws);
  b->ws = NULL;
  b->nws = 0;
  free(b->lat);
  b->lat = NULL;
  b->nlat = 0;
  b->closing = 0;
}
