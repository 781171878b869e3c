/*
 * rolllb: HAProxy in front of the nodes of `converger bench roll --lb
 * haproxy` (bench/roll.c).
 *
 * The configuration is deploy/haproxy/converger.cfg's (HTTP mode, /readyz
 * health checks, leastconn, retries 2 with redispatch, tunnel timeout 1 h,
 * the same client/server/fin timeouts), with two differences: one frontend
 * on a free loopback port and no stats page; and checks every 250 ms
 * instead of 1 s (fall 2, rise 2), so a draining node, whose /readyz turns
 * 503 at SIGTERM, leaves the rotation within about 0.5-0.75 s. It is written
 * to DIR/haproxy.cfg and HAProxy's standard error (its warnings: servers
 * going down and up) to DIR/haproxy.log. No request log.
 *
 * What it owns: the HAProxy process (`haproxy -db -f DIR/haproxy.cfg`, in
 * the foreground, its own process group, SIGKILLed if the bench dies),
 * stopped by its pid with rolllb_stop. Main thread only.
 */
#ifndef CONVERGER_TOOLS_BENCH_ROLLLB_H
#define CONVERGER_TOOLS_BENCH_ROLLLB_H

#include <stddef.h>
#include <sys/types.h>

typedef struct {
  pid_t pid; /* 0 when not running */
  int port;  /* the frontend's loopback port; set by rolllb_init */
  char dir[4096];
} rolllb_t;

/* Pick a free loopback port for the frontend (lb->port), so that the nodes
 * can be given the load balancer's URL as their public URL before it
 * starts. Returns 0, or -1 with a reason in `err`. */
int rolllb_init(rolllb_t *lb, char *err, size_t errlen);

/* Write `dir`/haproxy.cfg for the `n` nodes on 127.0.0.1:`ports`[i] (named
 * roll-i), start HAProxy, and wait (at most 10 s) until GET /readyz through
 * it answers 200. `dir` must exist. Returns 0, or -1 with a reason in `err`
 * (haproxy not installed, it exited: the end of its log, or no answer); a
 * started process is stopped again before returning -1. */
int rolllb_start(rolllb_t *lb, const char *dir, const int *ports, size_t n, char *err,
                 size_t errlen);

/* SIGTERM HAProxy (an immediate stop in -db mode) and reap it; SIGKILL
 * after 5 s. No-op when it is not running. */
void rolllb_stop(rolllb_t *lb);

#endif
