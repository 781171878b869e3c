/*
 * restc: the bench's REST client of the node, in two forms.
 *
 * Blocking calls (restc_call, restc_expect, restc_token, restc_setup) for
 * setup and checks, made while no loop runs: one request per fresh
 * connection (Connection: close, through net/httpc.h) to
 * 127.0.0.1:b->port, authorized with b->api_key, bounded by 10 s in all,
 * cut short when run_interrupted is set.
 *
 * The appenders of the delivery phase (restc_begin, restc_end): --rest-conns
 * keep-alive connections in the bench's loop, on which the phase writes
 * every append at once (pipelined, with run_send on &b->rest[i].tcp). Each
 * 201 answer raises b->rest_answers; any other answer fails the bench.
 *
 * Main thread only. This header does not include bench/run.h, which
 * includes it for restc_t; callers include bench/run.h too.
 */
#ifndef CONVERGER_TOOLS_BENCH_RESTC_H
#define CONVERGER_TOOLS_BENCH_RESTC_H

#include <llhttp.h>
#include <stddef.h>
#include <uv.h>

typedef struct bench_s bench_t;

/* One REST connection of the delivery phase (pipelined appends). */
typedef struct {
  uv_tcp_t tcp;
  uv_connect_t creq;
  bench_t *b;
  llhttp_t parser;
  int handle;
  char body[256]; /* the answer being read, for error messages */
  size_t blen;
} restc_t;

/* One blocking request: `method` `path` with the JSON `body` (NULL: none)
 * and `extra_headers` (NULL or "Name: value\r\n" lines). Returns the HTTP
 * status with the answer's body in `out` (NUL-terminated, truncated to
 * out_cap - 1 bytes; out_cap >= 1), or -1 with the reason in b->http_err
 * (does not fail the bench). */
int restc_call(bench_t *b, const char *method, const char *path, const char *body,
               const char *extra_headers, char *out, size_t out_cap);

/* restc_call that must answer `want`: returns 0, or -1 after run_fail with
 * the status and body (or the reason). `out` may be NULL (a local buffer
 * then holds the body). */
int restc_expect(bench_t *b, const char *method, const char *path, const char *body,
                 const char *extra, int want, char *out, size_t cap);

/* POST /v1/tokens on the node at b->port: a token for `sub` covering
 * every conversation for 86 400 s, signed by that node (its secret).
 * Returns it malloc'ed (the caller frees it), or NULL after run_fail(b). */
char *restc_token(bench_t *b, const char *sub);

/* Append `n` bytes at `at` to the response body in `buf` (`cap` bytes,
 * `*len` used), truncating what does not fit and keeping it
 * NUL-terminated: the llhttp on_body of the bench's REST connections. */
void restc_body_add(char *buf, size_t cap, size_t *len, const char *at, size_t n);

/* Create one channel, RUN_CONVS conversations with RUN_SETUP_HEAD messages
 * each, the fan-out conversation (empty), and a token covering every
 * conversation, kept in b->token (malloc'ed; the caller frees it). Returns 0
 * or -1 (b->err set). */
int restc_setup(bench_t *b);

/* Allocate b->rest and start connecting its b->rest_conns connections in
 * b->loop; each one raises b->rest_connected once it is connected and
 * reading. Returns 0, or -1 (b->err set); restc_end cleans up either way. */
int restc_begin(bench_t *b);

/* Close every connection of b->rest with RST, let their close callbacks
 * run, and free b->rest. No-op when there is none. */
void restc_end(bench_t *b);

#endif
