/*
 * run: the state of one `converger bench baseline` run (bench_t), its one
 * failure channel (run_fail), and the loop driver that runs a phase until
 * it is complete, fails or times out.
 *
 * What it owns: nothing beyond bench_t's definition; bench_baseline_main
 * allocates the bench_t, the other modules (bench/node.h, bench/restc.h,
 * bench/wsclient.h) read and update its fields. The counters of the current
 * phase (nopen, nsynced, msgs, rest_connected, rest_answers) are raised by
 * the connections; the want_* fields say when the phase is complete.
 *
 * Main thread only: the loop runs on the thread that calls run_phase, and
 * the blocking setup calls run with no loop running. run_interrupted is the
 * one thing written elsewhere, by the signal handler.
 */
#ifndef CONVERGER_TOOLS_BENCH_RUN_H
#define CONVERGER_TOOLS_BENCH_RUN_H

#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <uv.h>

#include "common/jitter.h"

typedef struct bench_s bench_t;

#include "bench/restc.h"
#include "bench/wsclient.h"

#define RUN_CONVS          100 /* conversations of the memory and handshake phases */
#define RUN_SETUP_HEAD     2   /* messages in each of them before the handshakes */
#define RUN_READ_BUF_BYTES (256 * 1024)
#define RUN_NS             1000000000.0 /* nanoseconds per second */

/* The number of the signal that asked the bench to stop, 0 while none did.
 * Set by bench_baseline_main's handler; every wait checks it. */
extern volatile sig_atomic_t run_interrupted;

struct bench_s {
  /* options */
  int conns, handshakes, subs, messages, rest_conns, node_cpu, client_cpu, timeout_s;

  /* the node */
  pid_t pid;       /* 0 when not running */
  int node_exited; /* reaped; node_status holds the wait status */
  int node_status;
  int port;
  int keep_port; /* bnode_start reuses b->port (> 0) instead of picking a free one */
  int keep_keys; /* bnode_start keeps b->api_key and b->secret instead of new ones */
  char dir[256]; /* temporary data directory; "" when none */
  char exe[PATH_MAX];
  char api_key[65], secret[65];
  char *token;
  char http_err[160]; /* why the last blocking HTTP call failed */
  /* 1: the node serves TLS with a certificate bnode_start makes in dir
   * (bench/tlscert.h), the blocking REST calls use https and trust it */
  int tls;
  char tls_cert[300], tls_key[300]; /* its files; "" without tls */

  /* the loop and the current phase */
  uv_loop_t loop;
  int loop_ready;
  uv_timer_t watch;
  const char *phase;
  uint64_t phase_start_ns, deadline_ns, last_progress_ns, hold_until_ns;
  int stopped; /* uv_stop called because the phase is complete */
  int failed;
  char err[512];
  jitter_rng_t rng;

  /* the current set of WebSocket connections */
  wsc_t *ws;
  size_t nws, next_open, opening, nopen, nsynced;
  size_t handles;          /* uv handles (WebSocket and REST) not closed yet */
  int auto_hello;          /* send hello as soon as the 101 arrives */
  int fanout;              /* hello subscribes to the fan-out conversation */
  int64_t hello_watermark; /* -1: null */
  int closing;             /* tearing down: lost connections are expected */
  uint64_t msgs, seq_errors;
  uint64_t *lat; /* hello -> synced per connection, ns (handshake rounds) */
  size_t nlat;

  /* REST connections of the delivery phase */
  restc_t *rest; /* rest_conns of them while the delivery phase runs */
  size_t rest_connected, rest_answers;

  /* for `converger bench store` (bench/store.c); zero for the others */
  const char *hello_conv; /* hello subscribes to this conversation (NULL: run_conv_name's) */
  int ws_port;            /* WebSocket connections go to this port (0: b->port) */
  /* Called for every "msg" frame before b->msgs is raised, with the frame's
   * text (not NUL-terminated, valid during the call only) and its seq. */
  void (*on_msg)(bench_t *b, int64_t seq, const char *frame, size_t len);
  void *user; /* the on_msg callback's data */

  /* what completes the phase; done_ns is when it was complete */
  size_t want_open, want_synced, want_rest_connected, want_rest_answers;
  uint64_t want_msgs;
  uint64_t msgs_done_ns, rest_done_ns, done_ns;

  char read_buf[RUN_READ_BUF_BYTES]; /* every read of every connection lands here */
};

/* One integer option of a bench: --name VALUE or --name=VALUE. */
typedef struct {
  const char *name; /* without the leading "--" */
  long long *value; /* set when the option is given */
  long long min, max;
} run_int_opt_t;

/* Parse argv (the bench's own arguments) against `n` integer options;
 * --help or -h prints usage(stdout). Returns 0, 1 after --help, or -1 after
 * printing one line, prefixed with `cmd` ("converger bench NAME"), naming
 * the unknown option, the missing value or the value out of [min, max].
 * Main thread. */
int run_parse_int_options(const char *cmd, int argc, char **argv, const run_int_opt_t *opts,
                          size_t n, void (*usage)(FILE *out));

/* Take the `n` string options `names` ("--name VALUE" or "--name=VALUE")
 * out of argv: each value goes to *dest[i] (pointing into argv), every
 * other argument to `rest` (argc + 1 entries) in order, counted in *nrest,
 * for run_parse_int_options. Returns 0, or -1 after printing "CMD: --name
 * needs a value". Main thread. */
int run_split_string_options(const char *cmd, int argc, char **argv, const char *const *names,
                             const char **const *dest, size_t n, char **rest, int *nrest);

/* The handlers of SIGINT, SIGTERM and SIGHUP before run_signals_catch. */
typedef struct {
  struct sigaction old_int, old_term, old_hup;
} run_signals_t;

/* Catch SIGINT, SIGTERM and SIGHUP into run_interrupted (the bench stops
 * and cleans up at its next check), ignore SIGPIPE; `saved` receives the
 * previous handlers for run_signals_restore. Main thread. */
void run_signals_catch(run_signals_t *saved);
void run_signals_restore(const run_signals_t *saved);

/* printf a one-line reason into `err` (`errlen` bytes; nothing when err is
 * NULL or errlen 0), the error channel of the bench's helper modules. Any
 * thread. */
void run_set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The exit status of a spawned child whose exec failed (as a shell's). */
#define RUN_EXEC_FAILED 127

/* How run_spawn starts a child. */
typedef struct {
  char *const *env; /* NULL: this process's environment */
  int out_fd;       /* its stdout; -1: /dev/null */
  int err_fd;       /* its stderr; -1: this process's */
  int death_sig;    /* sent to it if this process dies (PR_SET_PDEATHSIG) */
  int own_group;    /* 1: its own process group, so a terminal's Ctrl-C reaches
                       the bench only, which then stops it in order */
  int cpu;          /* pin it to this CPU; -1: no pinning */
} run_spawn_opts_t;

/* Start argv[0] (a path, or a name looked up in PATH) with argv, stdin
 * from /dev/null. SIGINT, SIGTERM and SIGHUP are blocked across the fork,
 * so that one arriving before the child has reset its handlers is not run
 * by the bench's handler in the child and lost; the child resets them and
 * SIGPIPE to their defaults. Returns the child's pid, or -1 with errno set
 * (fork failed). A failed exec shows as exit status RUN_EXEC_FAILED, with a
 * line on the child's stderr. Main thread. */
pid_t run_spawn(char *const argv[], const run_spawn_opts_t *o);

/* Stop a child run_spawn started: SIGTERM, then SIGKILL if it has not exited
 * within wait_ms; reaps it. Returns its wait status, with *killed (may be
 * NULL) set to 1 when SIGKILL was needed. Main thread. */
int run_stop_child(pid_t pid, int wait_ms, int *killed);

/* Raise RLIMIT_NOFILE's soft limit to the hard one (util_raise_nofile: at
 * most 1 048 576) and return the soft limit in force afterwards; child
 * processes inherit it. Main thread. */
unsigned long long run_raise_nofile(void);

/* The monotonic clock (uv_hrtime), in nanoseconds. */
uint64_t run_now_ns(void);

/* qsort comparators: ascending uint64_t, ascending double. */
int run_cmp_u64(const void *a, const void *b);
int run_cmp_double(const void *a, const void *b);

/* The median of `n` >= 1 values (the mean of the middle two for an even
 * n); sorts `v` in place. */
double run_median(double *v, size_t n);

/* Record why the bench fails (printf-style, truncated to sizeof b->err)
 * and stop the loop if it runs. Only the first failure is kept; later calls
 * only stop the loop again. Never returns an error. */
void run_fail(bench_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Sleep `ms` milliseconds (blocking; for the waits with no loop running). */
void run_sleep_ms(long ms);

/* A newly allocated printf-formatted string; the caller frees it. NULL when
 * out of memory or on a format error. */
char *run_str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The id of conversation `index` (0 .. RUN_CONVS-1), or of the fan-out
 * conversation when `index` is negative, into `out`. */
void run_conv_name(int index, char out[32]);

/* Stop the loop when the phase is complete: every want_* reached and the
 * hold (hold_until_ns) over. Sets b->done_ns and b->stopped. Called by the
 * connections after each counter they raise, and by the watch timer. */
void run_maybe_done(bench_t *b);

/* Run the loop until the phase `name` (kept in b->phase, a string that must
 * outlive the phase) is complete, it fails, or --timeout passes; prints a
 * progress line to stderr every 5 s. Returns 0, or -1 with b->err set. */
int run_phase(bench_t *b, const char *name);

/* Turn the loop without blocking until the handles just closed are gone
 * (b->handles is down to `left`); other connections may still be open. */
void run_drain_closes(bench_t *b, size_t left);

/* Write `len` bytes to `s`: at once if the socket takes them (the usual
 * case on loopback), otherwise queue a copy of the rest, freed when the
 * write completes. The caller keeps `data`. Returns 0, or a negative libuv
 * error after run_fail (a failed queued write fails the bench later, unless
 * b->closing). */
int run_send(bench_t *b, uv_stream_t *s, const char *data, size_t len);

#endif
