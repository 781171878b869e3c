/*
 * restc: the bench's REST client of the node, in two forms.
 *
 * Blocking calls (restc_call, restc_expect, restc_token, restc_setup) for
 * setup and checks, made while no loop runs: one request per fresh
 * connection (Connection: close, through net/httpc.h) to
 * 127.0.0.1:b->port, authorized with b->api_key, bounded by 10 s in all,
 * cut short when run_interrupted is set.
 *
 * Keep-alive connections in the bench's loop (restc_open, restc_close):
 * one restc_t each, to 127.0.0.1:b->port, on which the caller writes
 * requests (run_send on &r->tcp, pipelined or one at a time) and gets
 * every answer's status through its callback. A lost connection or a bad
 * answer fails the bench (run_fail) unless b->closing. Two users: the
 * appenders of baseline's delivery phase (restc_begin, restc_end:
 * --rest-conns of them in b->rest, every 201 raises b->rest_answers, any
 * other answer fails the bench) and bench/appender.h's senders.
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
typedef struct restc_s restc_t;

/* A keep-alive connection is connected and reading. */
typedef void (*restc_connected_cb)(restc_t *r);
/* A complete answer with HTTP `status`; its body is in r->body. */
typedef void (*restc_answer_cb)(restc_t *r, int status);

/* One keep-alive REST connection in b->loop; embed it (container_of) to
 * keep state of your own beside it. */
struct restc_s {
  uv_tcp_t tcp;
  uv_connect_t creq;
  bench_t *b;
  llhttp_t parser;
  size_t index; /* the caller's number for it, in error messages */
  int handle;   /* uv_tcp_init done and not closed yet */
  restc_connected_cb on_connected;
  restc_answer_cb on_answer;
  char body[256]; /* the answer being read (NUL-terminated, truncated), for error messages */
  size_t blen;
};

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

/* Create one channel, RUN_CONVS conversations with RUN_SETUP_HEAD messages
 * each, the fan-out conversation (empty), and a token covering every
 * conversation, kept in b->token (malloc'ed; the caller frees it). Returns 0
 * or -1 (b->err set). */
int restc_setup(bench_t *b);

/* Start connecting `r` (zeroed by the caller, or closed before) to
 * 127.0.0.1:b->port in b->loop, with TCP_NODELAY; raises b->handles.
 * `on_connected` runs once it is connected and reading (not when the
 * connect fails, that fails the bench, nor once b->closing is set);
 * `on_answer` for every answer read until restc_close. Returns 0, or -1
 * after run_fail; close it with restc_close either way. */
int restc_open(bench_t *b, restc_t *r, size_t index, restc_connected_cb on_connected,
               restc_answer_cb on_answer);

/* Close `r` with RST (uv_close if that fails); its close callback lowers
 * b->handles. Returns 1 when a close was started, 0 when `r` was not open.
 * The caller then turns the loop (run_drain_closes) before freeing `r`. */
int restc_close(restc_t *r);

/* Allocate b->rest and start connecting its b->rest_conns connections in
 * b->loop; each one raises b->rest_connected once it is connected and
 * reading. Returns 0, or -1 (b->err set); restc_end cleans up either way. */
int restc_begin(bench_t *b);

/* Close every connection of b->rest with RST, let their close callbacks
 * run, and free b->rest. No-op when there is none. */
void restc_end(bench_t *b);

#endif
