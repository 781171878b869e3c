/*
 * node: the child `converger serve` a bench run measures. It is this
 * executable (or, with CONVERGER_BENCH_NODE=PATH in the bench's own
 * environment, that one: another build's node measured side by side by
 * the same bench), started on a free loopback port with a fresh temporary data
 * directory (its SQLite database and node.log), a random API key and token
 * secret, none of the caller's CONVERGER_* or WS_HANDSHAKE_* settings,
 * heartbeats and the hello timeout pushed out of the way, and pinned to
 * --node-cpu. It runs in its own process group and gets SIGKILL
 * if the bench dies.
 *
 * What it owns: the child process (b->pid, reaped by bnode_gone or
 * bnode_stop) and the directory (b->dir, removed by bnode_remove_dir).
 * Readings come from /proc (RSS, CPU ticks of the process and of its loop
 * thread) and from GET /admin/status over bench/restc.h.
 *
 * Main thread only. Errors go through run_fail (b->err) unless said.
 */
#ifndef CONVERGER_TOOLS_BENCH_NODE_H
#define CONVERGER_TOOLS_BENCH_NODE_H

#include <stddef.h>
#include <sys/types.h>

#include "bench/run.h"

/* CPU use at one instant, for bnode_cpu_text over an interval. */
typedef struct {
  long long node_ticks, loop_ticks; /* node process / its loop thread */
  long long node_sys_ticks;         /* of node_ticks, in the kernel */
  double self_s;                    /* this process, user + system */
  uint64_t ns;
} bnode_cpu_snap_t;

/* A loopback TCP port that was free a moment ago (bound to 0, then
 * closed), or -1. */
int bnode_free_port(void);

/* Start the node: create b->dir, pick b->port (unless b->keep_port and
 * b->port > 0: a restart on the same port), b->api_key and b->secret
 * (unless b->keep_keys: nodes sharing one store and one token secret),
 * fork and exec `b->exe serve` (b->exe read from /proc/self/exe) with its
 * stdout and stderr in b->dir/node.log. Sets b->pid. Does not wait for it
 * to be ready (bnode_wait_ready). Returns 0 or -1 (b->err set; b->dir may
 * exist and is left for bnode_remove_dir). */
int bnode_start(bench_t *b);

/* bnode_start with `extra_env`: NULL or a NULL-terminated array of
 * "NAME=value" strings (copied) set in the node's environment after the
 * bench's own settings, so they win; an inherited variable of the same name
 * is dropped. Inherited CONVERGER_* and WS_HANDSHAKE_* settings never reach
 * the node. Same returns as bnode_start. */
int bnode_start_env(bench_t *b, const char *const *extra_env);

/* Poll GET /readyz every 20 ms until it answers 200. Returns 0, or -1 when
 * the node exits, a signal arrives or 30 s pass (b->err set). */
int bnode_wait_ready(bench_t *b);

/* The node's counts of WebSocket connections, HTTP connections (this call's
 * own included) and subscriptions, from GET /admin/status. Returns 0, or -1
 * (b->err set; the outputs may be unset). */
int bnode_counts(bench_t *b, long *ws, long *http, long *subs);

/* Wait until the node has dropped every WebSocket connection of the last
 * phase (and no HTTP connection but ours is left), so that phases do not
 * overlap; polls every 20 ms for at most 30 s. Returns 0 or -1 (b->err
 * set). */
int bnode_wait_idle(bench_t *b);

/* 1 when the node is not running (exited, reaped now or before: then
 * b->node_status holds the wait status and b->pid is 0), 0 while it runs.
 * Does not block. */
int bnode_gone(bench_t *b);

/* SIGTERM the node and reap it; SIGKILL after 10 s. Prints to stderr when
 * it needed SIGKILL or ended with anything but status 0. No-op when it is
 * not running. Never fails. */
void bnode_stop(bench_t *b);

/* Print the last `lines` lines of b->dir/node.log (at most 16 KiB) to
 * stderr; nothing when there is no directory or log. */
void bnode_print_log_tail(bench_t *b, int lines);

/* Remove b->dir and the files in it (not subdirectories) and clear b->dir;
 * prints to stderr when it cannot. No-op when b->dir is "". */
void bnode_remove_dir(bench_t *b);

/* "exit status N", "killed by signal N, NAME" or "wait status N" for the
 * wait status `st`, written to `buf` (`len` bytes); returns buf. */
const char *bnode_status_text(int st, char *buf, size_t len);

/* A "Name:   123 kB" line of /proc/PID/status (e.g. name "VmRSS"), in kB;
 * -1 when unreadable. */
long bnode_status_kb(pid_t pid, const char *name);

/* Read the node's and its loop thread's CPU ticks and this process's CPU
 * time into `s`, with the time now. Unreadable ticks are -1 (then
 * bnode_cpu_text says so). */
void bnode_cpu_snap(bench_t *b, bnode_cpu_snap_t *s);

/* Write "node CPU 97% (loop thread 61%, store workers 36%; in the kernel
 * 45%), bench CPU 40%" over the interval a -> z into `out` (`len` bytes);
 * returns the node's CPU seconds over it, or -1 when unreadable (the text
 * then says "CPU use unavailable"). Clock ticks are 10 ms, so short
 * intervals read coarse. */
double bnode_cpu_text(const bnode_cpu_snap_t *a, const bnode_cpu_snap_t *z, char *out, size_t len);

#endif
