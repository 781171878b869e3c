/*
 * netfuzz: the harness of the network fuzz targets (fuzz_http.c,
 * fuzz_ws.c). One call drives one connection through the real transport
 * (net/conn.c, net/http.c on llhttp, net/ws.c on wslay) with a fake handler
 * above it, as a socket would: the bytes are written into the peer end of
 * a socketpair(2) whose other end was given to conn_adopt, the loop runs
 * until the connection is quiet, then the peer closes and the loop runs
 * until the connection is freed.
 *
 * The fake handler (netfuzz.c) answers as the node's layers do, with the
 * calls they use: GET /v1/ws is checked with ws_check_upgrade and upgraded
 * with ws_upgrade; GET /healthz, /readyz and /livez are answered at once;
 * POST /v1/conversations/ID/messages is answered on a later loop turn (as
 * the REST layer answers after its pool job: a conn_ref held meanwhile),
 * so pipelined input waits; GET /v1/sse reads its Last-Event-ID with
 * session_sse_watermark (400 when bad) and becomes a stream
 * (ws_start_sse) that gets a welcome, the msg after the watermark, a
 * synced, a signal, a heartbeat and, with `drain` in the query, a drain
 * event, with `close`, a close event (1012); anything else gets 404 or
 * 405. Text messages
 * go through frame_decode and get a frame back (welcome, pong, sent,
 * synced, or error), sent with ws_send_text or, for `sent`, encoded once
 * with ws_encode_text and queued with ws_send_frame as the bus does. A
 * hello whose token is "close" is answered with ws_close(1008).
 *
 * The input is written in chunks of a fixed cycle of sizes (1 to 4096
 * bytes), each followed by a turn of the loop, so the parsers see requests
 * and frames split at many places. Deterministic: the clock is faked
 * (util_mono_fake) and nothing depends on timing.
 *
 * With NETFUZZ_ECHO set in the environment, what the connection writes is
 * copied to stderr (and the log is at debug), to see what an input does.
 *
 * Not thread-safe; one loop (static) for the whole process. A hang or a
 * connection that is never freed aborts (a finding).
 */
#ifndef CONVERGER_TESTS_FUZZ_NETFUZZ_H
#define CONVERGER_TESTS_FUZZ_NETFUZZ_H

#include <stddef.h>
#include <stdint.h>

/* Drive one connection: write `prefix` (may be NULL) together with the
 * first chunk of `data`, then the rest of `data` in chunks; read and
 * discard what the connection answers; close; wait until it is freed.
 * Returns 0 (the fuzz target's return value). */
int netfuzz_run(const uint8_t *prefix, size_t prefix_len, const uint8_t *data, size_t len);

#endif
