/*
 * wsclient: the bench's WebSocket client connections to the node, one set
 * at a time (b->ws, b->nws), all in the bench's loop.
 *
 * A connection connects, writes the upgrade request by hand (a random
 * Sec-WebSocket-Key, protocol converger.v1) and waits for the 101; at most
 * OPEN_WINDOW (256) connections are connecting or upgrading at once, and
 * each one that opens starts the next. Server frames (unmasked, never
 * fragmented by the node) are parsed in place in the one shared read
 * buffer b->read_buf; only a frame split across two reads is copied, into
 * its connection's `partial` buffer (bounded by 1 MiB per frame). Client
 * frames are masked (RFC 6455 section 5.3) with xoshiro output from b->rng:
 * unpredictable enough for a benchmark, not for production. Frames are told
 * apart by their `"type":"..."` text: "synced" raises b->nsynced (and
 * records the hello -> synced latency in b->lat when it is allocated),
 * "msg" calls b->on_msg when set, raises b->msgs and checks that seqs
 * follow each other (else b->seq_errors), "error" and "drain" fail the
 * bench, pings are answered. Connections go to b->ws_port when it is set
 * (else b->port), and hello subscribes to b->hello_conv when it is set.
 *
 * Any loss of a connection (EOF, error, close frame, bad frame) fails the
 * bench, except while b->closing.
 *
 * Main thread only. This header does not include bench/run.h, which
 * includes it for wsc_t; callers include bench/run.h too.
 */
#ifndef CONVERGER_TOOLS_BENCH_WSCLIENT_H
#define CONVERGER_TOOLS_BENCH_WSCLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct bench_s bench_t;

typedef enum { WSC_NEW, WSC_CONNECTING, WSC_UPGRADING, WSC_OPEN, WSC_LOST } wsc_state_t;

/* One client WebSocket connection. */
typedef struct {
  uv_tcp_t tcp;
  uv_connect_t creq;
  bench_t *b;
  uint32_t index;
  uint8_t state;  /* wsc_state_t */
  uint8_t handle; /* uv_tcp_init done and uv_close not yet called */
  uint8_t synced;
  int64_t seq;       /* last seq seen; -1 unknown (watermark null, before synced) */
  uint64_t hello_ns; /* when hello was written */
  uint8_t *partial;  /* a frame (or the 101 answer) split across reads */
  uint32_t plen, pcap;
} wsc_t;

/* Reset the phase's counters and want_* fields, and allocate a new set of
 * `n` connections in b->ws, none opened yet (wsc_open_more). Each one sends
 * hello as soon as it is open when `auto_hello`; hello subscribes to the
 * fan-out conversation when `fanout` (otherwise to conversation
 * index % RUN_CONVS) with `watermark` (-1: null). Returns 0, or -1 when out
 * of memory (b->err set). The previous set must have been ended. */
int wsc_set_begin(bench_t *b, size_t n, int auto_hello, int fanout, int64_t watermark);

/* Start connections of the set until OPEN_WINDOW are connecting or
 * upgrading (or all are started). Each open connection raises b->nopen.
 * Errors fail the bench (b->err); the connections started stay for
 * wsc_set_end. */
void wsc_open_more(bench_t *b);

/* Write hello on the open connection `c` and note when (for the latency).
 * Fails the bench when the token does not fit a 4 KiB hello. */
void wsc_send_hello(wsc_t *c);

/* Close every connection of the set with RST (no close handshake, no
 * TIME_WAIT), let their close callbacks run, and free the set, its partial
 * buffers and b->lat. No-op when there is no set. */
void wsc_set_end(bench_t *b);

#endif
