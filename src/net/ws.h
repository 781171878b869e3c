/*
 * ws: the WebSocket side of a connection (RFC 6455) on wslay.
 *
 * Incoming: a wslay event context per connection parses frames, answers
 * pings and close frames, enforces the message size limit (close 1009) and
 * UTF-8 in text messages (close 1007). Complete text messages go to
 * session_on_text(). Binary messages: close 1003. Protocol errors (RFC 6455
 * sections 5.1-5.5: an unmasked frame, reserved bits or opcodes, a control
 * frame over 125 bytes or fragmented, a bad length encoding, a continuation
 * out of place): close 1002.
 * Outgoing: text frames are encoded by the net's one wslay frame context
 * (net_t.encoder) and copied into the connection's output buffer; a frame
 * for many subscribers is encoded once (ws_encode_text) and copied as
 * bytes.
 * Loop thread only.
 */
#ifndef CONVERGER_NET_WS_H
#define CONVERGER_NET_WS_H

#include <stddef.h>
#include <stdint.h>

#include "net/conn.h"
#include "net/http.h"
#include "common/wskey.h"

#define WS_SUBPROTOCOL "converger.v1"

/* Close codes, RFC 6455 section 7.4.1 (and IANA registry for 1012/1013). */
enum {
  WS_CLOSE_NORMAL = 1000,
  WS_CLOSE_GOING_AWAY = 1001,
  WS_CLOSE_PROTOCOL_ERROR = 1002,
  WS_CLOSE_UNSUPPORTED_DATA = 1003,
  WS_CLOSE_INVALID_PAYLOAD = 1007,
  WS_CLOSE_POLICY_VIOLATION = 1008,
  WS_CLOSE_MESSAGE_TOO_BIG = 1009,
  WS_CLOSE_INTERNAL_ERROR = 1011,
  WS_CLOSE_SERVICE_RESTART = 1012,
  WS_CLOSE_TRY_AGAIN_LATER = 1013,
};

/* Validate an upgrade request (RFC 6455 section 4.2.1: GET, HTTP/1.1 or
 * later, Upgrade: websocket, Connection: upgrade, a 16-byte base64
 * Sec-WebSocket-Key, version 13, and when subprotocols are offered one of
 * them is converger.v1). Returns 0 or an HTTP status (400, 405) with *why
 * set to a static message. */
int ws_check_upgrade(const http_request_t *req, const char **why);

/* Answer 101, switch the connection to WebSocket mode and start the
 * session. Returns 0 or a negative error (connection closed). */
int ws_upgrade(conn_t *c, const http_request_t *req);

/* Feed bytes read from the socket. */
void ws_feed(conn_t *c, const char *data, size_t len);

/* Queue one text frame with `len` bytes of payload. */
void ws_send_text(conn_t *c, const char *text, size_t len);

/* Queue pre-encoded frame bytes (from ws_encode_text). */
void ws_send_frame(conn_t *c, const char *frame, size_t len);

/* Encode a text frame (header + payload) with `net`'s encoder into a heap
 * buffer; *len gets its size. Caller frees. NULL on OOM. Loop thread. */
char *ws_encode_text(net_t *net, const char *text, size_t text_len, size_t *len);

/* Send a close frame with `code` and `reason` (<= 123 bytes), then
 * half-close and close. Further input is ignored. Idempotent. */
void ws_close(conn_t *c, int code, const char *reason);

/* 1 once a close frame went out on `c` (ours, or the answer to the
 * peer's): nothing more is sent on it. */
int ws_close_sent(const conn_t *c);

/* 1 when `c` is an open message connection (a WebSocket, or an SSE stream
 * made one by ws_start_sse): not closing, and no close frame sent. The drain
 * and the shed move or close only these. Loop thread. */
int ws_is_open(const conn_t *c);

/* The first open message connection (ws_is_open) of `net` after `c`, in
 * net->conns order; `c` NULL: from the first. NULL when there is none. It
 * walks the list, so a loop over all of them is O(connections):
 *   for (conn_t *c = ws_next_open(net, NULL); c; c = ws_next_open(net, c))
 * `c` must still be in the list (not freed). Loop thread. */
conn_t *ws_next_open(net_t *net, conn_t *c);

/* Send a ping (heartbeat). */
void ws_ping(conn_t *c);

/* Server-Sent Events (docs/protocol.md 12): make the HTTP connection `c`
 * (its request read, not answered) a message connection like a
 * WebSocket: mode CONN_WS, counted in nws, given a session by the
 * handler's on_upgrade, its frames written as events (`event:` the frame's
 * type, `data:` its JSON). Nothing is answered until the first frame: a
 * welcome starts the 200 text/event-stream answer with a `retry:` of
 * `retry_ms`; an error (or a close) first is answered with its HTTP
 * status (401, 403, 404, 409, 429, 503 with Retry-After, else 400) and a
 * JSON body. A drain frame carries its afterMs as `retry:` and ends the
 * stream; ws_close ends it with a `close` event; ws_ping writes a comment.
 * The welcome, synced, drain and close events carry the handler's sse_id
 * as their `id:` (a msg its own, ws_send_msg). Input is ignored. 0, or -1
 * (connection closed). */
int ws_start_sse(conn_t *c, long retry_ms);
/* 1 when `c` is such a stream. */
int ws_is_sse(const conn_t *c);
/* A message for one connection in both encodings: the pre-encoded
 * WebSocket `frame` (NULL: encode `json`) on a WebSocket, `json` as an
 * event with `sse_id` (NULL: no id) on a stream. */
void ws_send_msg(conn_t *c, const char *frame, size_t frame_len, const char *json, size_t json_len,
                 const char *sse_id);

/* 1 when a prepared WebSocket frame goes out on `c` as it is, so that it
 * can be queued by reference (conn_write_shared): an open WebSocket, not a
 * stream, its close frame not queued. It reads a bit of the connection
 * alone (conn_t.ws_frames), not the WebSocket state: a fan-out to
 * thousands of connections asks it of each (proto/sub.c). Loop thread. */
static inline int ws_takes_frames(const conn_t *c) { return c->ws_frames && !c->closing; }

/* Free `net`'s encoder (conn_net_free calls it); it is made again when
 * next needed. */
void ws_encoder_free(net_t *net);

/* Free the WebSocket state (called when the connection is freed). */
void ws_free(ws_t *ws);

#endif
