/*
 * run.c: the failure channel, small helpers and the loop driver of a bench
 * run (see bench/run.h).
 */
#include "bench/run.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/node.h"
#include "cli/args.h"
#include "common/util.h"

volatile sig_atomic_t run_interrupted;

uint64_t run_now_ns(void) { return uv_hrtime(); }

void run_fail(bench_t *b, const char *fmt, ...) {
  if (!b->failed) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err, sizeof b->err, fmt, ap);
    va_end(ap);
    b->failed = 1;
  }
  if (b->loop_ready) uv_stop(&b->loop);
}

void run_sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

char *run_str_printf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return NULL;
  char *s = malloc((size_t)n + 1);
  if (!s) return NULL;
  va_start(ap, fmt);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return s;
}

void run_conv_name(int index, char out[32]) {
  if (index < 0)
    snprintf(out, 32, "bench-fanout");
  else
    snprintf(out, 32, "bench-%03d", index);
}

/* ---- the loop: phases ------------------------------------------------------------ */

static void progress_text(bench_t *b, char *out, size_t len) {
  snprintf(out, len, "%zu/%zu upgraded, %zu/%zu synced, %llu/%llu messages, %zu/%zu REST answers",
           b->nopen, b->want_open, b->nsynced, b->want_synced, (unsigned long long)b->msgs,
           (unsigned long long)b->want_msgs, b->rest_answers, b->want_rest_answers);
}

void run_maybe_done(bench_t *b) {
  if (b->stopped || b->failed) return;
  if (b->nopen < b->want_open || b->nsynced < b->want_synced || b->msgs < b->want_msgs ||
      b->rest_connected < b->want_rest_connected || b->rest_answers < b->want_rest_answers)
    return;
  uint64_t now = run_now_ns();
  if (now < b->hold_until_ns) return;
  b->done_ns = now;
  b->stopped = 1;
  uv_stop(&b->loop);
}

static void watch_cb(uv_timer_t *t) {
  bench_t *b = container_of(t, bench_t, watch);
  uint64_t now = run_now_ns();
  char text[200], why[96];
  if (run_interrupted) {
    run_fail(b, "interrupted by signal %d", (int)run_interrupted);
    return;
  }
  if (bnode_gone(b)) {
    run_fail(b, "the node exited (%s)", bnode_status_text(b->node_status, why, sizeof why));
    return;
  }
  if (now >= b->deadline_ns) {
    progress_text(b, text, sizeof text);
    run_fail(b, "timed out after %d s: %s", b->timeout_s, text);
    return;
  }
  if (now - b->last_progress_ns >= 5 * (uint64_t)RUN_NS) {
    b->last_progress_ns = now;
    progress_text(b, text, sizeof text);
    fprintf(stderr, "  ... %s: %s\n", b->phase, text);
  }
  run_maybe_done(b); /* a hold (settling) ends here */
}

/* Run the loop until the phase is complete (want_* reached and the hold
 * over), it fails, or --timeout passes. Returns 0 or -1 (b->err set). */
int run_phase(bench_t *b, const char *name) {
  b->phase = name;
  b->stopped = 0;
  b->phase_start_ns = b->last_progress_ns = run_now_ns();
  b->deadline_ns = b->phase_start_ns + (uint64_t)b->timeout_s * (uint64_t)RUN_NS;
  uv_timer_start(&b->watch, watch_cb, 50, 50);
  run_maybe_done(b);
  uv_run(&b->loop, UV_RUN_DEFAULT);
  uv_timer_stop(&b->watch);
  if (b->failed) return -1;
  if (!b->stopped) { /* the loop ran out of handles: should not happen */
    run_fail(b, "%s: the loop ended early", name);
    return -1;
  }
  return 0;
}

/* Turn the loop without blocking until the handles just closed are gone
 * (b->handles is down to `left`); other connections may still be open. */
void run_drain_closes(bench_t *b, size_t left) {
  for (int i = 0; i < 100000 && b->handles > left; i++) uv_run(&b->loop, UV_RUN_NOWAIT);
}

/* ---- writes (WebSocket and REST connections) ----------------------------------- */

typedef struct {
  uv_write_t req;
  bench_t *b;
  char data[];
} wreq_t;

static void write_cb(uv_write_t *req, int status) {
  wreq_t *w = container_of(req, wreq_t, req);
  bench_t *b = w->b;
  free(w);
  if (status < 0 && status != UV_ECANCELED && !b->closing)
    run_fail(b, "%s: write: %s", b->phase, uv_strerror(status));
}

/* Write now if the socket takes it (the usual case on loopback); queue a
 * copy of the rest otherwise. */
int run_send(bench_t *b, uv_stream_t *s, const char *data, size_t len) {
  uv_buf_t buf = uv_buf_init((char *)data, (unsigned)len);
  int n = uv_try_write(s, &buf, 1);
  if (n >= 0 && (size_t)n == len) return 0;
  if (n < 0 && n != UV_EAGAIN) {
    run_fail(b, "%s: write: %s", b->phase, uv_strerror(n));
    return n;
  }
  size_t done = n > 0 ? (size_t)n : 0;
  wreq_t *w = malloc(sizeof *w + len - done);
  if (!w) {
    run_fail(b, "out of memory");
    return UV_ENOMEM;
  }
  w->b = b;
  memcpy(w->data, data + done, len - done);
  buf = uv_buf_init(w->data, (unsigned)(len - done));
  int r = uv_write(&w->req, s, &buf, 1, write_cb);
  if (r != 0) {
    free(w);
    run_fail(b, "%s: write: %s", b->phase, uv_strerror(r));
  }
  return r;
}

int run_parse_int_options(const char *cmd, int argc, char **argv, const run_int_opt_t *opts,
                          size_t n, void (*usage)(FILE *out)) {
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *value = NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 1;
    }
    size_t k = 0;
    int missing = 0;
    char flag[64];
    for (; k < n && !value && !missing; k++) {
      snprintf(flag, sizeof flag, "--%s", opts[k].name);
      value = cli_flag_value(argc, argv, &i, flag, &missing);
    }
    if (missing) {
      fprintf(stderr, "%s: %s needs a value\n", cmd, a);
      return -1;
    }
    if (!value) {
      fprintf(stderr, "%s: unknown option \"%s\" (see --help)\n", cmd, a);
      return -1;
    }
    const run_int_opt_t *o = &opts[k - 1];
    if (cli_parse_ll(value, o->min, o->max, o->value) != 0) {
      fprintf(stderr, "%s: invalid --%s \"%s\": want an integer in [%lld, %lld]\n", cmd, o->name,
              value, o->min, o->max);
      return -1;
    }
  }
  return 0;
}

static void on_signal(int sig) { run_interrupted = sig; }

void run_signals_catch(run_signals_t *saved) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &saved->old_int);
  sigaction(SIGTERM, &sa, &saved->old_term);
  sigaction(SIGHUP, &sa, &saved->old_hup);
  signal(SIGPIPE, SIG_IGN);
}

void run_set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || !errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

pid_t run_spawn(char *const argv[], const run_spawn_opts_t *o) {
  sigset_t stop_sigs, old_mask;
  sigemptyset(&stop_sigs);
  sigaddset(&stop_sigs, SIGINT);
  sigaddset(&stop_sigs, SIGTERM);
  sigaddset(&stop_sigs, SIGHUP);
  sigprocmask(SIG_BLOCK, &stop_sigs, &old_mask);
  pid_t parent = getpid();
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    if (o->own_group) setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, o->death_sig);
    if (getppid() != parent) _exit(RUN_EXEC_FAILED);
    if (o->cpu >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(o->cpu, &set);
      sched_setaffinity(0, sizeof set, &set);
    }
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    dup2(o->out_fd >= 0 ? o->out_fd : null_fd, STDOUT_FILENO);
    if (o->err_fd >= 0) dup2(o->err_fd, STDERR_FILENO);
    if (o->env)
      execvpe(argv[0], argv, o->env);
    else
      execvp(argv[0], argv);
    dprintf(STDERR_FILENO, "converger bench: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(RUN_EXEC_FAILED);
  }
  int fork_errno = errno;
  sigprocmask(SIG_SETMASK, &old_mask, NULL);
  if (pid < 0) {
    errno = fork_errno;
    return -1;
  }
  if (o->own_group) setpgid(pid, pid); /* also here: no race with the child's own call */
  return pid;
}

int run_stop_child(pid_t pid, int wait_ms, int *killed) {
  int st = 0;
  if (killed) *killed = 0;
  kill(pid, SIGTERM);
  uint64_t until = run_now_ns() + (uint64_t)wait_ms * 1000000u;
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) return st;
    if (run_now_ns() >= until) break;
    run_sleep_ms(10);
  }
  if (killed) *killed = 1;
  kill(pid, SIGKILL);
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return st;
}

unsigned long long run_raise_nofile(void) {
  uint64_t now;
  util_raise_nofile(NULL, &now);
  return (unsigned long long)now;
}

void run_signals_restore(const run_signals_t *saved) {
  sigaction(SIGINT, &saved->old_int, NULL);
  sigaction(SIGTERM, &saved->old_term, NULL);
  sigaction(SIGHUP, &saved->old_hup, NULL);
}

int run_split_string_options(const char *cmd, int argc, char **argv, const char *const *names,
                             const char **const *dest, size_t n, char **rest, int *nrest) {
  *nrest = 0;
  for (int i = 0; i < argc; i++) {
    const char *v = NULL;
    int missing = 0;
    size_t k = 0;
    for (; k < n && !v && !missing; k++) v = cli_flag_value(argc, argv, &i, names[k], &missing);
    if (missing) {
      fprintf(stderr, "%s: %s needs a value\n", cmd, argv[i]);
      return -1;
    }
    if (v)
      *dest[k - 1] = v;
    else
      rest[(*nrest)++] = argv[i];
  }
  return 0;
}

int run_cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int run_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double run_median(double *v, size_t n) {
  qsort(v, n, sizeof *v, run_cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
