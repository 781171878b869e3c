/*
 * appender: the REST senders of `converger bench store` (bench/store.c),
 * and its two load phases on the bench's loop (b->loop):
 *
 *   appender_throughput: N keep-alive connections to the node at b->port,
 *     each a closed-loop sender (one POST .../messages in flight, the next
 *     written as soon as the 201 is read), for a warm-up and then a window
 *     of fixed duration; counts the answers read inside the window and
 *     their latencies (POST written -> answer read).
 *   appender_paced: K keep-alive connections and one WebSocket subscriber
 *     (bench/wsclient.h) on any node of the same store; messages are
 *     scheduled at a fixed rate, each written on an idle connection (or
 *     queued until one is free), and the time each is written, answered
 *     and received by the subscriber is noted, matched by message id.
 *
 * Every append has a unique Idempotency-Key (the message id) and a 100-byte
 * JSON body. A 503 (the node's pool shed the job before it ran: nothing was
 * stored) is counted as refused and the same append, same key, is written
 * again at once on the same connection: the sender keeps its place in the
 * offered load, and its latency runs from the first write. A 200 (the key
 * is known) is accepted only after such a refusal and counts as the
 * acknowledgement. Any other answer fails the bench (run_fail), as does a
 * lost connection. Both phases end by themselves: the throughput phase when the
 * window is over and every sender's last answer is in; the paced phase when
 * every message is answered and received, or --wait after the last write
 * (then the missing ones are "lost" to the caller), once every answer is
 * in. Each phase is also bounded by b->timeout_s (run_phase).
 *
 * Main thread only, with no loop running when called. The connections are
 * closed (RST) before each function returns, on errors too.
 */
#ifndef CONVERGER_TOOLS_BENCH_APPENDER_H
#define CONVERGER_TOOLS_BENCH_APPENDER_H

#include <stddef.h>
#include <stdint.h>

#include "bench/run.h"

#define APPENDER_BODY_BYTES 100 /* the JSON body of every message */

/* What appender_throughput measured. The arrays are malloc'ed; free them
 * with appender_tput_free. */
typedef struct {
  uint64_t answered;  /* 201 answers read inside the window */
  double window_s;    /* the window's length, seconds */
  uint64_t *lat_ns;   /* latency of each of those answers, ns (first write -> read) */
  uint64_t refused;   /* 503 answers (each retried), in the window or not */
  uint64_t retry_200; /* appends acknowledged by a 200 to their retry */
  size_t nlat;
  uint64_t *acks; /* per conversation: every 201 answer, warm-up and tail included */
  uint64_t *win;  /* per conversation: the answers counted in `answered` (inside the window) */
  size_t nconvs;
} appender_tput_t;

/* Run `nsenders` closed-loop senders against the node at b->port; sender i
 * appends to convs[i % nconvs], then convs[(i + nsenders) % nconvs] and
 * so on (more conversations than senders: each sender goes round its
 * share), with keys "<i>-<k>". The window opens
 * `warmup_ms` after the first writes and lasts `duration_ms`; a sender
 * whose answer comes after the window stops. Fills `out` (zeroed first).
 * Returns 0, or -1 with b->err set (out may then hold partial counts;
 * free it all the same). */
int appender_throughput(bench_t *b, size_t nsenders, const char *const *convs, size_t nconvs,
                        uint64_t warmup_ms, uint64_t duration_ms, appender_tput_t *out);

void appender_tput_free(appender_tput_t *t);

/* What the senders POST from now on: "messages" (appends, acknowledged by
 * 201; the default) or "signals" (POST .../signals, not stored,
 * acknowledged by 202: docs/protocol.md 9.7), for the same requests and
 * bodies. Main thread. */
void appender_route(const char *what);

/* What appender_paced measured, per message i (id "L<i>"), on run_now_ns's
 * clock; 0 = never. The arrays are malloc'ed; free with appender_paced_free. */
typedef struct {
  size_t n;
  uint64_t *sched_ns, *write_ns, *ack_ns, *recv_ns;
  uint64_t seq_errors; /* the subscriber saw seqs that do not follow each other */
  uint64_t dup;        /* messages the subscriber received more than once */
  uint64_t refused;    /* 503 answers (each retried) */
  uint64_t retry_200;  /* appends acknowledged by a 200 to their retry */
} appender_paced_t;

/* Schedule rate * duration_ms / 1000 messages to conversation `conv` on
 * the node at b->port over `nconns` connections, message i at i / rate s
 * after the start; one WebSocket subscriber of `conv` (watermark null,
 * hello with `sub_token`) on the node at 127.0.0.1:`sub_port` (b->port or
 * another node's) is welcomed and synced before the first message. Waits
 * at most `wait_ms` after the last write for the missing deliveries. Fills
 * `out` (zeroed first). Returns 0, or -1 with b->err set. */
int appender_paced(bench_t *b, size_t nconns, const char *conv, int sub_port, const char *sub_token,
                   long long rate, long long duration_ms, long long wait_ms, appender_paced_t *out);

void appender_paced_free(appender_paced_t *p);

#endif
