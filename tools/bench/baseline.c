/*
 * baseline.c: `converger bench baseline`, the three baseline figures of one
 * node (docs/benchmarks/baseline.md):
 *   1. resident memory per idle WebSocket connection at --conns N, each with
 *      one subscription (watermark null), spread over CONVS conversations;
 *   2. handshakes per second, hello -> welcome + synced, on connections
 *      already upgraded: one round with a one-message replay read from the
 *      store (watermark head-1), one round with watermark null;
 *   3. deliveries per second to --subs S subscribers of one conversation
 *      while --messages M bodies of 100 bytes are appended over REST.
 *
 * What it owns: a child `converger serve` (this executable) on a free
 * loopback port with a fresh temporary data directory, pinned to
 * --node-cpu, its log in that directory; the bench itself is pinned to
 * --client-cpu. Setup talks REST over blocking sockets (no loop running);
 * the phases run every client connection in one libuv loop on this thread.
 *
 * Client side: the upgrade request is written by hand; server frames
 * (unmasked, never fragmented by the node) are parsed in place in one
 * shared read buffer, and only a frame split across two reads is copied,
 * into its connection's `partial` buffer. Client frames are masked (RFC 6455
 * section 5.3) with xoshiro output: unpredictable enough for a benchmark,
 * not for production. Frames are told apart by their `"type":"..."` text.
 * The appends of phase 3 are pipelined over --rest-conns keep-alive
 * connections, every request written at once.
 *
 * Invariants: every phase has a deadline (--timeout) and fails with a
 * message instead of waiting; whatever happens, the client sockets are
 * closed (with RST, so no TIME_WAIT piles up), the node is stopped (SIGTERM,
 * SIGKILL after 10 s) and reaped, and the temporary directory is removed.
 */
#include "bench/bench.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <llhttp.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "core/jitter.h"
#include "core/util.h"

#define CONVS          100 /* conversations of the memory and handshake phases */
#define SETUP_HEAD     2   /* messages in each of them before the handshakes */
#define BODY_BYTES     100 /* JSON body of each message appended in phase 3 */
#define OPEN_WINDOW    256 /* connections connecting or upgrading at once */
#define READ_BUF_BYTES (256 * 1024)
#define FRAME_MAX      (1u << 20) /* largest server frame accepted */
#define UPGRADE_MAX    8192       /* largest 101 answer accepted */
#define SETTLE_MS      2000       /* idle time before the second RSS reading */
#define READY_WAIT_MS  30000
#define IDLE_WAIT_MS   30000 /* for the node to drop the closed connections */
#define STOP_WAIT_MS   10000 /* SIGTERM, then SIGKILL */
#define FDS_SPARE      256   /* descriptors besides the connections */
#define NS             1000000000.0

static volatile sig_atomic_t interrupted;

typedef enum { WSC_NEW, WSC_CONNECTING, WSC_UPGRADING, WSC_OPEN, WSC_LOST } wsc_state_t;

struct bench_s;

/* One client WebSocket connection. */
typedef struct {
  uv_tcp_t tcp;
  uv_connect_t creq;
  struct bench_s *b;
  uint32_t index;
  uint8_t state;  /* wsc_state_t */
  uint8_t handle; /* uv_tcp_init done and uv_close not yet called */
  uint8_t synced;
  int64_t seq;       /* last seq seen; -1 unknown (watermark null, before synced) */
  uint64_t hello_ns; /* when hello was written */
  uint8_t *partial;  /* a frame (or the 101 answer) split across reads */
  uint32_t plen, pcap;
} wsc_t;

/* One REST connection of the delivery phase (pipelined appends). */
typedef struct {
  uv_tcp_t tcp;
  uv_connect_t creq;
  struct bench_s *b;
  llhttp_t parser;
  int handle;
  char body[256]; /* the answer being read, for error messages */
  size_t blen;
} restc_t;

typedef struct {
  long long node_ticks, loop_ticks; /* node process / its loop thread */
  long long node_sys_ticks;         /* of node_ticks, in the kernel */
  double self_s;                    /* this process, user + system */
  uint64_t ns;
} cpu_snap_t;

typedef struct {
  double bytes_per_conn;
  long rss_before_kb, rss_after_kb;
  double hs_rate[2]; /* [0]: one-message replay, [1]: watermark null */
  double deliveries;
  int have_memory, have_hs[2], have_deliveries;
} results_t;

typedef struct bench_s {
  /* options */
  int conns, handshakes, subs, messages, rest_conns, node_cpu, client_cpu, timeout_s;

  /* the node */
  pid_t pid;       /* 0 when not running */
  int node_exited; /* reaped; node_status holds the wait status */
  int node_status;
  int port;
  char dir[256]; /* temporary data directory; "" when none */
  char exe[PATH_MAX];
  char api_key[65], secret[65];
  char *token;
  char http_err[160]; /* why the last blocking HTTP call failed */

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

  /* what completes the phase; done_ns is when it was complete */
  size_t want_open, want_synced, want_rest_connected, want_rest_answers;
  uint64_t want_msgs;
  uint64_t msgs_done_ns, rest_done_ns, done_ns;

  char read_buf[READ_BUF_BYTES]; /* every read of every connection lands here */
} bench_t;

static uint64_t now_ns(void) { return uv_hrtime(); }

static void fail(bench_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fail(bench_t *b, const char *fmt, ...) {
  if (!b->failed) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err, sizeof b->err, fmt, ap);
    va_end(ap);
    b->failed = 1;
  }
  if (b->loop_ready) uv_stop(&b->loop);
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- options ----------------------------------------------------------------- */

static void usage(FILE *out) {
  fprintf(out, "usage: converger bench baseline [options]\n\n"
               "Starts a node (this executable, `converger serve`) on a free loopback port\n"
               "with a temporary data directory and measures, over 127.0.0.1 only:\n"
               "  1. resident memory per idle WebSocket connection (one subscription each);\n"
               "  2. handshakes per second, hello -> welcome + synced, with a one-message\n"
               "     replay read from the store, then with watermark null;\n"
               "  3. deliveries per second to the subscribers of one conversation while\n"
               "     messages with 100-byte bodies are appended over REST.\n"
               "Results go to stdout (with a Markdown table row), progress to stderr.\n\n"
               "  --conns N        idle connections for the memory figure [10000]\n"
               "  --handshakes N   hellos per handshake round [5000]\n"
               "  --subs N         subscribers of the fan-out conversation [5000]\n"
               "  --messages N     messages appended in the delivery phase [200]\n"
               "  --rest-conns N   keep-alive connections carrying the appends [16]\n"
               "  --node-cpu N     CPU the node is pinned to, -1: not pinned [first CPU]\n"
               "  --client-cpu N   CPU the bench is pinned to, -1: not pinned\n"
               "                   [second CPU; not pinned on a one-CPU machine]\n"
               "  --timeout S      limit of each phase in seconds [60]\n"
               "  --help           this text\n");
}

/* Returns 0, 1 after --help, or -1 after printing why (exit status 2). */
static int parse_options(bench_t *b, int argc, char **argv, const cpu_set_t *allowed) {
  struct {
    const char *name;
    int *value;
    long min, max;
  } opts[] = {
      {"conns", &b->conns, 1, 1000000},
      {"handshakes", &b->handshakes, 1, 1000000},
      {"subs", &b->subs, 1, 1000000},
      {"messages", &b->messages, 1, 1000000},
      {"rest-conns", &b->rest_conns, 1, 1000},
      {"node-cpu", &b->node_cpu, -1, CPU_SETSIZE - 1},
      {"client-cpu", &b->client_cpu, -1, CPU_SETSIZE - 1},
      {"timeout", &b->timeout_s, 1, 86400},
  };
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 1;
    }
    size_t k = 0;
    const char *value = NULL;
    for (; k < CV_ARRAY_SIZE(opts); k++) {
      size_t nl = strlen(opts[k].name);
      if (strncmp(a, "--", 2) != 0 || strncmp(a + 2, opts[k].name, nl) != 0) continue;
      if (a[2 + nl] == '=') {
        value = a + 3 + nl;
        break;
      }
      if (a[2 + nl] == '\0') {
        if (i + 1 >= argc) {
          fprintf(stderr, "converger bench baseline: %s needs a value\n", a);
          return -1;
        }
        value = argv[++i];
        break;
      }
    }
    if (k == CV_ARRAY_SIZE(opts)) {
      fprintf(stderr, "converger bench baseline: unknown option \"%s\" (see --help)\n", a);
      return -1;
    }
    char *end;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (errno || *value == '\0' || *end || v < opts[k].min || v > opts[k].max) {
      fprintf(stderr,
              "converger bench baseline: invalid --%s \"%s\": want an integer in [%ld, %ld]\n",
              opts[k].name, value, opts[k].min, opts[k].max);
      return -1;
    }
    *opts[k].value = (int)v;
  }
  int cpus[2] = {b->node_cpu, b->client_cpu};
  for (int i = 0; i < 2; i++)
    if (cpus[i] >= 0 && !CPU_ISSET(cpus[i], allowed)) {
      fprintf(stderr, "converger bench baseline: CPU %d is not available to this process\n",
              cpus[i]);
      return -1;
    }
  return 0;
}

/* ---- the node: start, readiness, /proc readings, stop ------------------------------ */

static const char *wait_status_text(int st, char *buf, size_t len) {
  if (WIFEXITED(st))
    snprintf(buf, len, "exit status %d", WEXITSTATUS(st));
  else if (WIFSIGNALED(st))
    snprintf(buf, len, "killed by signal %d, %s", WTERMSIG(st), strsignal(WTERMSIG(st)));
  else
    snprintf(buf, len, "wait status %d", st);
  return buf;
}

/* 1 when the node is not running (exited, reaped now or before). */
static int node_gone(bench_t *b) {
  if (b->pid <= 0) return 1;
  int st;
  pid_t r = waitpid(b->pid, &st, WNOHANG);
  if (r == b->pid) {
    b->node_status = st;
    b->node_exited = 1;
    b->pid = 0;
    return 1;
  }
  return 0;
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

static char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static char *str_printf(const char *fmt, ...) {
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

/* The child's environment: ours without CONVERGER_* settings, plus the
 * bench's. NULL-terminated; free each string and the array. */
static char **node_env(bench_t *b) {
  extern char **environ;
  size_t n = 0;
  while (environ[n]) n++;
  char **env = calloc(n + 16, sizeof *env);
  if (!env) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "CONVERGER_", 10) != 0) env[k++] = strdup(environ[i]);
  env[k++] = str_printf("CONVERGER_LISTEN=127.0.0.1:%d", b->port);
  env[k++] = str_printf("CONVERGER_DATABASE_URL=sqlite:%s/c.db", b->dir);
  env[k++] = str_printf("CONVERGER_API_KEY=%s", b->api_key);
  env[k++] = str_printf("CONVERGER_TOKEN_SECRET=%s", b->secret);
  env[k++] = strdup("CONVERGER_SQLITE_SYNC=off");         /* benchmark only */
  env[k++] = strdup("CONVERGER_HEARTBEAT_MS=3600000");    /* no pings while measuring */
  env[k++] = strdup("CONVERGER_HELLO_TIMEOUT_MS=600000"); /* upgraded sockets wait for hello */
  env[k++] = strdup("CONVERGER_NODE_ID=bench");
  for (size_t i = 0; i < k; i++)
    if (!env[i]) {
      for (size_t j = 0; j < k; j++) free(env[j]);
      free(env);
      return NULL;
    }
  return env;
}

static void env_free(char **env) {
  for (size_t i = 0; env && env[i]; i++) free(env[i]);
  free(env);
}

static int node_start(bench_t *b) {
  ssize_t n = readlink("/proc/self/exe", b->exe, sizeof b->exe - 1);
  if (n <= 0) {
    fail(b, "cannot read /proc/self/exe: %s", strerror(errno));
    return -1;
  }
  b->exe[n] = '\0';
  const char *tmp = getenv("TMPDIR");
  if (!tmp || !*tmp || strlen(tmp) > 200) tmp = "/tmp";
  snprintf(b->dir, sizeof b->dir, "%s/converger-bench-XXXXXX", tmp);
  if (!mkdtemp(b->dir)) {
    fail(b, "cannot create a temporary directory %s: %s", b->dir, strerror(errno));
    b->dir[0] = '\0';
    return -1;
  }
  if ((b->port = free_port()) < 0) {
    fail(b, "cannot find a free loopback port: %s", strerror(errno));
    return -1;
  }
  if (util_random_hex(b->api_key, 32) != 0 || util_random_hex(b->secret, 32) != 0) {
    fail(b, "cannot generate the API key and token secret");
    return -1;
  }
  char log_path[PATH_MAX];
  snprintf(log_path, sizeof log_path, "%s/node.log", b->dir);
  int log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  char **env = node_env(b);
  if (log_fd < 0 || null_fd < 0 || !env) {
    fail(b, "cannot prepare the node's log, stdin or environment: %s", strerror(errno));
    if (log_fd >= 0) close(log_fd);
    if (null_fd >= 0) close(null_fd);
    env_free(env);
    return -1;
  }
  pid_t parent = getpid();
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    /* Child: its own process group (a terminal's Ctrl-C reaches the bench
     * only, which then stops the node in order), killed if the bench dies. */
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    if (b->node_cpu >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(b->node_cpu, &set);
      sched_setaffinity(0, sizeof set, &set);
    }
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    dup2(null_fd, 0);
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    char *args[] = {b->exe, (char *)"serve", NULL};
    execve(b->exe, args, env);
    dprintf(2, "converger bench: cannot run %s: %s\n", b->exe, strerror(errno));
    _exit(127);
  }
  int fork_errno = errno;
  close(log_fd);
  close(null_fd);
  env_free(env);
  if (pid < 0) {
    fail(b, "fork: %s", strerror(fork_errno));
    return -1;
  }
  setpgid(pid, pid); /* also here: no race with the child's own call */
  b->pid = pid;
  return 0;
}

static void node_stop(bench_t *b) {
  if (b->pid <= 0) return;
  kill(b->pid, SIGTERM);
  uint64_t until = now_ns() + (uint64_t)STOP_WAIT_MS * 1000000u;
  while (!node_gone(b)) {
    if (now_ns() >= until) {
      fprintf(stderr, "converger bench: the node did not stop within %d s; SIGKILL\n",
              STOP_WAIT_MS / 1000);
      kill(b->pid, SIGKILL);
      int st;
      while (waitpid(b->pid, &st, 0) < 0 && errno == EINTR) {
      }
      b->node_status = st;
      b->node_exited = 1;
      b->pid = 0;
      return;
    }
    sleep_ms(10);
  }
  char why[96];
  if (!WIFEXITED(b->node_status) || WEXITSTATUS(b->node_status) != 0)
    fprintf(stderr, "converger bench: the node ended with %s after SIGTERM\n",
            wait_status_text(b->node_status, why, sizeof why));
}

static void print_node_log_tail(bench_t *b, int lines) {
  if (!b->dir[0]) return;
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/node.log", b->dir);
  FILE *f = fopen(path, "r");
  if (!f) return;
  static char buf[16384];
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  long from = size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0;
  fseek(f, from, SEEK_SET);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *p = buf + n;
  int seen = 0;
  while (p > buf && seen <= lines)
    if (*--p == '\n') seen++;
  if (*p == '\n') p++;
  fprintf(stderr, "---- last lines of the node's log (%s) ----\n%s%s----\n", path, p,
          n && buf[n - 1] != '\n' ? "\n" : "");
}

static void remove_dir(bench_t *b) {
  if (!b->dir[0]) return;
  DIR *d = opendir(b->dir);
  if (d) {
    struct dirent *e;
    char path[sizeof b->dir + 260];
    while ((e = readdir(d)) != NULL) {
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
      snprintf(path, sizeof path, "%s/%s", b->dir, e->d_name);
      unlink(path);
    }
    closedir(d);
  }
  if (rmdir(b->dir) != 0)
    fprintf(stderr, "converger bench: cannot remove %s: %s\n", b->dir, strerror(errno));
  b->dir[0] = '\0';
}

/* A "Name:   123 kB" line of /proc/PID/status, in kB; -1 when unreadable. */
static long proc_status_kb(pid_t pid, const char *name) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  long kb = -1;
  size_t nl = strlen(name);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, name, nl) == 0 && line[nl] == ':') {
      kb = strtol(line + nl + 1, NULL, 10);
      break;
    }
  fclose(f);
  return kb;
}

/* utime + stime of a /proc stat file in clock ticks, stime alone in *sys;
 * -1 when unreadable. */
static long long proc_ticks(const char *path, long long *sys) {
  char buf[1024];
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
  unsigned long long ut, st;
  /* after the name: state ppid pgrp session tty tpgid flags minflt cminflt
   * majflt cmajflt utime stime (proc(5)) */
  if (!p || sscanf(p + 1, "%*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu %llu", &ut, &st) != 2)
    return -1;
  if (sys) *sys = (long long)st;
  return (long long)(ut + st);
}

static void cpu_snap(bench_t *b, cpu_snap_t *s) {
  char path[96];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)b->pid);
  s->node_ticks = proc_ticks(path, &s->node_sys_ticks);
  snprintf(path, sizeof path, "/proc/%d/task/%d/stat", (int)b->pid, (int)b->pid);
  s->loop_ticks = proc_ticks(path, NULL);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  s->self_s = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
              ru.ru_stime.tv_usec / 1e6;
  s->ns = now_ns();
}

/* "node CPU 97% (loop thread 61%, store workers 36%; in the kernel 45%),
 * bench CPU 40%" over
 * the interval; returns the node's CPU seconds (-1 when unreadable). Clock
 * ticks are 10 ms, so short intervals read coarse. A node below ~95% while
 * the bench waits for it was not alone on its CPU. */
static double cpu_text(const cpu_snap_t *a, const cpu_snap_t *z, char *out, size_t len) {
  double wall = (double)(z->ns - a->ns) / NS;
  double hz = (double)sysconf(_SC_CLK_TCK);
  if (wall <= 0 || a->node_ticks < 0 || z->node_ticks < 0 || a->loop_ticks < 0 ||
      z->loop_ticks < 0) {
    snprintf(out, len, "CPU use unavailable");
    return -1;
  }
  double node = (double)(z->node_ticks - a->node_ticks) / hz;
  double sys = (double)(z->node_sys_ticks - a->node_sys_ticks) / hz;
  double loop = (double)(z->loop_ticks - a->loop_ticks) / hz;
  double self = z->self_s - a->self_s;
  snprintf(out, len,
           "node CPU %.0f%% (loop thread %.0f%%, store workers %.0f%%; in the kernel %.0f%%), "
           "bench CPU %.0f%%",
           node / wall * 100, loop / wall * 100, (node - loop) / wall * 100, sys / wall * 100,
           self / wall * 100);
  return node;
}

/* ---- blocking HTTP client (setup and checks; no loop running) --------------------- */

typedef struct {
  int done;
  char *body;
  size_t len, cap;
} sync_resp_t;

static int sync_on_body(llhttp_t *p, const char *at, size_t len) {
  sync_resp_t *r = p->data;
  size_t room = r->cap > r->len + 1 ? r->cap - r->len - 1 : 0;
  size_t n = len < room ? len : room;
  memcpy(r->body + r->len, at, n);
  r->len += n;
  r->body[r->len] = '\0';
  return 0;
}

static int sync_on_complete(llhttp_t *p) {
  ((sync_resp_t *)p->data)->done = 1;
  return HPE_PAUSED;
}

/* One request on a fresh connection (Connection: close), bounded by 10 s.
 * Returns the HTTP status with the body in `out` (truncated to out_cap - 1
 * bytes), or -1 with the reason in b->http_err. */
static int http_call(bench_t *b, const char *method, const char *path, const char *body,
                     const char *extra_headers, char *out, size_t out_cap) {
  static llhttp_settings_t settings;
  static int settings_ready;
  if (!settings_ready) {
    llhttp_settings_init(&settings);
    settings.on_body = sync_on_body;
    settings.on_message_complete = sync_on_complete;
    settings_ready = 1;
  }
  out[0] = '\0';
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(b->http_err, sizeof b->http_err, "socket: %s", strerror(errno));
    return -1;
  }
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)b->port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  size_t blen = body ? strlen(body) : 0;
  char *req = NULL;
  int status = -1;
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    snprintf(b->http_err, sizeof b->http_err, "connect: %s", strerror(errno));
    goto out;
  }
  req = str_printf("%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer %s\r\n"
                   "Content-Type: application/json\r\n%sContent-Length: %zu\r\n"
                   "Connection: close\r\n\r\n%s",
                   method, path, b->port, b->api_key, extra_headers ? extra_headers : "", blen,
                   body ? body : "");
  if (!req) {
    snprintf(b->http_err, sizeof b->http_err, "out of memory");
    goto out;
  }
  for (size_t off = 0, len = strlen(req); off < len;) {
    ssize_t k = send(fd, req + off, len - off, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR && !interrupted) continue;
    if (k <= 0) {
      snprintf(b->http_err, sizeof b->http_err, "send: %s", strerror(errno));
      goto out;
    }
    off += (size_t)k;
  }
  llhttp_t parser;
  llhttp_init(&parser, HTTP_RESPONSE, &settings);
  sync_resp_t resp = {0, out, 0, out_cap};
  parser.data = &resp;
  char buf[16384];
  while (!resp.done) {
    ssize_t k = recv(fd, buf, sizeof buf, 0);
    if (k < 0 && errno == EINTR && !interrupted) continue;
    if (k < 0) {
      snprintf(b->http_err, sizeof b->http_err, "recv: %s",
               errno == EAGAIN ? "no answer within 10 s" : strerror(errno));
      goto out;
    }
    if (k == 0) {
      snprintf(b->http_err, sizeof b->http_err, "the node closed the connection early");
      goto out;
    }
    llhttp_errno_t e = llhttp_execute(&parser, buf, (size_t)k);
    if (e != HPE_OK && e != HPE_PAUSED) {
      snprintf(b->http_err, sizeof b->http_err, "bad HTTP answer: %s",
               llhttp_get_error_reason(&parser));
      goto out;
    }
  }
  status = llhttp_get_status_code(&parser);
out:
  free(req);
  close(fd);
  return status;
}

/* A call that must answer `want`; otherwise fails the bench. */
static int http_expect(bench_t *b, const char *method, const char *path, const char *body,
                       const char *extra, int want, char *out, size_t cap) {
  char local[512];
  if (!out) {
    out = local;
    cap = sizeof local;
  }
  int st = http_call(b, method, path, body, extra, out, cap);
  if (st == want) return 0;
  if (st < 0)
    fail(b, "%s %s: %s", method, path, b->http_err);
  else
    fail(b, "%s %s answered %d (want %d): %.300s", method, path, st, want, out);
  return -1;
}

static int wait_ready(bench_t *b) {
  uint64_t until = now_ns() + (uint64_t)READY_WAIT_MS * 1000000u;
  char body[256];
  for (;;) {
    int st = http_call(b, "GET", "/readyz", NULL, NULL, body, sizeof body);
    if (st == 200) return 0;
    char why[96];
    if (node_gone(b)) {
      fail(b, "the node exited during start-up (%s)",
           wait_status_text(b->node_status, why, sizeof why));
      return -1;
    }
    if (interrupted) {
      fail(b, "interrupted");
      return -1;
    }
    if (now_ns() >= until) {
      fail(b, "GET /readyz did not answer 200 within %d s (last: %s)", READY_WAIT_MS / 1000,
           st < 0 ? b->http_err : body);
      return -1;
    }
    sleep_ms(20);
  }
}

/* The node's count of WebSocket and HTTP connections (GET /admin/status). */
static int node_counts(bench_t *b, long *ws, long *http, long *subs) {
  char body[1024];
  if (http_expect(b, "GET", "/admin/status", NULL, NULL, 200, body, sizeof body) != 0) return -1;
  json_t *v = json_loads(body, 0, NULL);
  *ws = (long)json_integer_value(json_object_get(v, "connections"));
  *http = (long)json_integer_value(json_object_get(v, "httpConnections"));
  *subs = (long)json_integer_value(json_object_get(v, "subscriptions"));
  int ok = json_is_integer(json_object_get(v, "connections"));
  json_decref(v);
  if (!ok) fail(b, "GET /admin/status: no \"connections\" in %.200s", body);
  return ok ? 0 : -1;
}

/* Wait until the node has dropped every WebSocket connection of the last
 * phase (and no HTTP connection but ours is left), so that phases do not
 * overlap. */
static int wait_node_idle(bench_t *b) {
  uint64_t until = now_ns() + (uint64_t)IDLE_WAIT_MS * 1000000u;
  long ws = 0, http = 0, subs = 0;
  for (;;) {
    if (node_counts(b, &ws, &http, &subs) != 0) return -1;
    if (ws == 0 && http <= 1) return 0;
    if (interrupted) {
      fail(b, "interrupted");
      return -1;
    }
    if (now_ns() >= until) {
      fail(b,
           "the node still counts %ld WebSocket and %ld HTTP connections %d s after the bench "
           "closed them",
           ws, http - 1, IDLE_WAIT_MS / 1000);
      return -1;
    }
    sleep_ms(20);
  }
}

static void conv_name(int index, char out[32]) {
  if (index < 0)
    snprintf(out, 32, "bench-fanout");
  else
    snprintf(out, 32, "bench-%03d", index);
}

/* One channel, CONVS conversations with SETUP_HEAD messages each, the
 * fan-out conversation (empty), and a token covering every conversation. */
static int setup(bench_t *b) {
  char path[96], body[256], extra[96], name[32], out[2048];
  if (http_expect(b, "POST", "/v1/channels", "{\"id\":\"bench\",\"name\":\"bench\"}", NULL, 201,
                  NULL, 0) != 0)
    return -1;
  for (int i = -1; i < CONVS; i++) {
    conv_name(i, name);
    snprintf(body, sizeof body, "{\"id\":\"%s\",\"channel\":\"bench\"}", name);
    if (http_expect(b, "POST", "/v1/conversations", body, NULL, 201, NULL, 0) != 0) return -1;
  }
  for (int i = 0; i < CONVS; i++)
    for (int k = 1; k <= SETUP_HEAD; k++) {
      conv_name(i, name);
      snprintf(path, sizeof path, "/v1/conversations/%s/messages", name);
      snprintf(extra, sizeof extra, "Idempotency-Key: setup-%d-%d\r\n", i, k);
      snprintf(body, sizeof body, "{\"sender\":\"bench\",\"body\":{\"text\":\"setup %d\"}}", k);
      if (http_expect(b, "POST", path, body, extra, 201, NULL, 0) != 0) return -1;
    }
  if (http_expect(b, "POST", "/v1/tokens",
                  "{\"sub\":\"bench\",\"convs\":[\"*\"],\"ttlSeconds\":86400}", NULL, 201, out,
                  sizeof out) != 0)
    return -1;
  json_t *v = json_loads(out, 0, NULL);
  const char *token = json_string_value(json_object_get(v, "token"));
  if (token) b->token = strdup(token);
  json_decref(v);
  if (!b->token) {
    fail(b, "POST /v1/tokens: no token in %.200s", out);
    return -1;
  }
  return 0;
}

/* ---- the loop: phases ------------------------------------------------------------ */

static void progress_text(bench_t *b, char *out, size_t len) {
  snprintf(out, len, "%zu/%zu upgraded, %zu/%zu synced, %llu/%llu messages, %zu/%zu REST answers",
           b->nopen, b->want_open, b->nsynced, b->want_synced, (unsigned long long)b->msgs,
           (unsigned long long)b->want_msgs, b->rest_answers, b->want_rest_answers);
}

static void maybe_done(bench_t *b) {
  if (b->stopped || b->failed) return;
  if (b->nopen < b->want_open || b->nsynced < b->want_synced || b->msgs < b->want_msgs ||
      b->rest_connected < b->want_rest_connected || b->rest_answers < b->want_rest_answers)
    return;
  uint64_t now = now_ns();
  if (now < b->hold_until_ns) return;
  b->done_ns = now;
  b->stopped = 1;
  uv_stop(&b->loop);
}

static void watch_cb(uv_timer_t *t) {
  bench_t *b = container_of(t, bench_t, watch);
  uint64_t now = now_ns();
  char text[200], why[96];
  if (interrupted) {
    fail(b, "interrupted by signal %d", (int)interrupted);
    return;
  }
  if (node_gone(b)) {
    fail(b, "the node exited (%s)", wait_status_text(b->node_status, why, sizeof why));
    return;
  }
  if (now >= b->deadline_ns) {
    progress_text(b, text, sizeof text);
    fail(b, "timed out after %d s: %s", b->timeout_s, text);
    return;
  }
  if (now - b->last_progress_ns >= 5 * (uint64_t)NS) {
    b->last_progress_ns = now;
    progress_text(b, text, sizeof text);
    fprintf(stderr, "  ... %s: %s\n", b->phase, text);
  }
  maybe_done(b); /* a hold (settling) ends here */
}

/* Run the loop until the phase is complete (want_* reached and the hold
 * over), it fails, or --timeout passes. Returns 0 or -1 (b->err set). */
static int run_phase(bench_t *b, const char *name) {
  b->phase = name;
  b->stopped = 0;
  b->phase_start_ns = b->last_progress_ns = now_ns();
  b->deadline_ns = b->phase_start_ns + (uint64_t)b->timeout_s * (uint64_t)NS;
  uv_timer_start(&b->watch, watch_cb, 50, 50);
  maybe_done(b);
  uv_run(&b->loop, UV_RUN_DEFAULT);
  uv_timer_stop(&b->watch);
  if (b->failed) return -1;
  if (!b->stopped) { /* the loop ran out of handles: should not happen */
    fail(b, "%s: the loop ended early", name);
    return -1;
  }
  return 0;
}

/* Turn the loop without blocking until the handles just closed are gone
 * (b->handles is down to `left`); other connections may still be open. */
static void drain_closes(bench_t *b, size_t left) {
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
    fail(b, "%s: write: %s", b->phase, uv_strerror(status));
}

/* Write now if the socket takes it (the usual case on loopback); queue a
 * copy of the rest otherwise. */
static int stream_send(bench_t *b, uv_stream_t *s, const char *data, size_t len) {
  uv_buf_t buf = uv_buf_init((char *)data, (unsigned)len);
  int n = uv_try_write(s, &buf, 1);
  if (n >= 0 && (size_t)n == len) return 0;
  if (n < 0 && n != UV_EAGAIN) {
    fail(b, "%s: write: %s", b->phase, uv_strerror(n));
    return n;
  }
  size_t done = n > 0 ? (size_t)n : 0;
  wreq_t *w = malloc(sizeof *w + len - done);
  if (!w) {
    fail(b, "out of memory");
    return UV_ENOMEM;
  }
  w->b = b;
  memcpy(w->data, data + done, len - done);
  buf = uv_buf_init(w->data, (unsigned)(len - done));
  int r = uv_write(&w->req, s, &buf, 1, write_cb);
  if (r != 0) {
    free(w);
    fail(b, "%s: write: %s", b->phase, uv_strerror(r));
  }
  return r;
}

/* ---- WebSocket client connections ------------------------------------------------ */

static const char *state_name(int s) {
  static const char *names[] = {"new", "connecting", "upgrading", "open", "lost"};
  return names[s];
}

static void ws_lost(wsc_t *c, const char *why) {
  bench_t *b = c->b;
  if (c->state == WSC_LOST) return;
  int was = c->state;
  c->state = WSC_LOST;
  uv_read_stop((uv_stream_t *)&c->tcp);
  if (!b->closing) fail(b, "%s: connection %u (%s): %s", b->phase, c->index, state_name(was), why);
}

static void send_frame(wsc_t *c, int opcode, const void *payload, size_t len) {
  uint8_t stack[4096];
  uint8_t *f = len + 14 <= sizeof stack ? stack : malloc(len + 14);
  if (!f) {
    fail(c->b, "out of memory");
    return;
  }
  size_t h = 0;
  f[h++] = (uint8_t)(0x80 | opcode); /* FIN */
  if (len < 126) {
    f[h++] = (uint8_t)(0x80 | len); /* MASK bit */
  } else if (len <= 0xffff) {
    f[h++] = 0x80 | 126;
    f[h++] = (uint8_t)(len >> 8);
    f[h++] = (uint8_t)len;
  } else {
    f[h++] = 0x80 | 127;
    for (int i = 7; i >= 0; i--) f[h++] = (uint8_t)((uint64_t)len >> (8 * i));
  }
  uint64_t r = jitter_next(&c->b->rng);
  uint8_t *mask = f + h;
  memcpy(mask, &r, 4);
  h += 4;
  const uint8_t *src = payload;
  for (size_t i = 0; i < len; i++) f[h + i] = src[i] ^ mask[i & 3];
  stream_send(c->b, (uv_stream_t *)&c->tcp, (const char *)f, h + len);
  if (f != stack) free(f);
}

static void send_hello(wsc_t *c) {
  bench_t *b = c->b;
  char conv[32], wm[24], text[4096];
  conv_name(b->fanout ? -1 : (int)(c->index % CONVS), conv);
  if (b->hello_watermark < 0)
    snprintf(wm, sizeof wm, "null");
  else
    snprintf(wm, sizeof wm, "%lld", (long long)b->hello_watermark);
  int n =
      snprintf(text, sizeof text,
               "{\"type\":\"hello\",\"token\":\"%s\",\"subs\":[{\"conv\":\"%s\",\"watermark\":%s}],"
               "\"client\":\"converger-bench\"}",
               b->token, conv, wm);
  if (n < 0 || (size_t)n >= sizeof text) {
    fail(b, "the token is too long for a hello (%zu bytes)", strlen(b->token));
    return;
  }
  c->seq = b->hello_watermark;
  c->hello_ns = now_ns();
  send_frame(c, 0x1, text, (size_t)n);
}

/* Append to the connection's partial buffer (bounded by FRAME_MAX). */
static int partial_append(wsc_t *c, const uint8_t *p, size_t n) {
  if ((size_t)c->plen + n > FRAME_MAX + 16) {
    ws_lost(c, "a frame larger than 1 MiB");
    return -1;
  }
  if (c->plen + n > c->pcap) {
    size_t cap = c->pcap ? c->pcap : 256;
    while (cap < c->plen + n) cap *= 2;
    uint8_t *q = realloc(c->partial, cap);
    if (!q) {
      fail(c->b, "out of memory");
      return -1;
    }
    c->partial = q;
    c->pcap = (uint32_t)cap;
  }
  memcpy(c->partial + c->plen, p, n);
  c->plen += (uint32_t)n;
  return 0;
}

/* The header of the server frame at p: 1 with its size and payload length,
 * 0 when more bytes are needed, -1 masked (servers must not mask), -2 over
 * FRAME_MAX. */
static int frame_header(const uint8_t *p, size_t n, size_t *hdr, uint64_t *len) {
  if (n < 2) return 0;
  if (p[1] & 0x80) return -1;
  uint64_t l = p[1] & 0x7f;
  size_t h = l == 126 ? 4 : l == 127 ? 10 : 2;
  if (n < h) return 0;
  if (l == 126) {
    l = (uint64_t)p[2] << 8 | p[3];
  } else if (l == 127) {
    l = 0;
    for (int i = 2; i < 10; i++) l = l << 8 | p[i];
  }
  if (l > FRAME_MAX) return -2;
  *hdr = h;
  *len = l;
  return 1;
}

/* The integer after `key` in a frame (e.g. "\"seq\":"), or -2. */
static int64_t int_after(const char *p, size_t len, const char *key) {
  size_t kl = strlen(key);
  const char *k = memmem(p, len, key, kl);
  if (!k) return -2;
  const char *q = k + kl, *end = p + len;
  int64_t v = 0;
  int any = 0;
  for (; q < end && *q >= '0' && *q <= '9'; q++, any = 1) v = v * 10 + (*q - '0');
  return any ? v : -2;
}

static void on_text(wsc_t *c, const char *p, size_t len) {
  bench_t *b = c->b;
  const char *t = memmem(p, len, "\"type\":\"", 8);
  if (!t) {
    ws_lost(c, "a text frame without \"type\"");
    return;
  }
  t += 8;
  size_t rest = (size_t)(p + len - t);
#define IS_TYPE(s) (rest >= sizeof(s) && memcmp(t, s "\"", sizeof(s)) == 0)
  if (IS_TYPE("msg")) {
    int64_t seq = int_after(p, len, "\"seq\":");
    if (c->seq >= 0 && seq != c->seq + 1) b->seq_errors++;
    c->seq = seq;
    if (++b->msgs == b->want_msgs) b->msgs_done_ns = now_ns();
    maybe_done(b);
  } else if (IS_TYPE("synced")) {
    int64_t head = int_after(p, len, "\"head\":");
    if (c->seq >= 0 && c->seq != head) b->seq_errors++; /* replay incomplete */
    c->seq = head;
    if (!c->synced) {
      c->synced = 1;
      b->nsynced++;
      if (b->lat && b->nlat < b->nws) b->lat[b->nlat++] = now_ns() - c->hello_ns;
    }
    maybe_done(b);
  } else if (IS_TYPE("error") || IS_TYPE("drain")) {
    char why[400];
    snprintf(why, sizeof why, "unexpected frame %.*s", (int)(len > 300 ? 300 : len), p);
    ws_lost(c, why);
  } /* welcome, pong, sent, unknown types: nothing to count */
#undef IS_TYPE
}

static void handle_frame(wsc_t *c, uint8_t b0, const uint8_t *payload, size_t len) {
  char why[200];
  switch (b0 & 0x0f) {
  case 0x1:
    if (!(b0 & 0x80)) {
      ws_lost(c, "a fragmented text frame (the node sends whole frames)");
      return;
    }
    on_text(c, (const char *)payload, len);
    return;
  case 0x9: /* ping: pong with the same payload */
    send_frame(c, 0xA, payload, len);
    return;
  case 0xA:
    return;
  case 0x8: {
    int code = len >= 2 ? payload[0] << 8 | payload[1] : 1005;
    int rlen = len > 2 ? (int)(len - 2 > 120 ? 120 : len - 2) : 0;
    snprintf(why, sizeof why, "closed by the node with %d \"%.*s\"", code, rlen,
             (const char *)payload + 2);
    ws_lost(c, why);
    return;
  }
  default:
    snprintf(why, sizeof why, "a frame with opcode %d", b0 & 0x0f);
    ws_lost(c, why);
  }
}

static int bad_header(wsc_t *c, int r) {
  ws_lost(c, r == -1 ? "a masked server frame" : "a frame larger than 1 MiB");
  return -1;
}

/* Parse server frames: first complete the one left in `partial` by an
 * earlier read, then the whole frames of this read in place; keep what is
 * left of the last one. */
static void frames_feed(wsc_t *c, const uint8_t *p, size_t n) {
  size_t hdr = 0;
  uint64_t len = 0;
  while (c->plen) {
    int r = frame_header(c->partial, c->plen, &hdr, &len);
    if (r < 0) {
      bad_header(c, r);
      return;
    }
    if (r == 1 && c->plen >= hdr + len) {
      size_t total = hdr + (size_t)len;
      handle_frame(c, c->partial[0], c->partial + hdr, (size_t)len);
      if (c->state != WSC_OPEN) return;
      memmove(c->partial, c->partial + total, c->plen - total);
      c->plen -= (uint32_t)total;
      continue;
    }
    if (n == 0) return;
    size_t want;
    if (r == 1)
      want = hdr + (size_t)len - c->plen;
    else if (c->plen < 2)
      want = 2 - c->plen;
    else
      want = (size_t)((c->partial[1] & 0x7f) == 126 ? 4 : 10) - c->plen;
    size_t take = want < n ? want : n;
    if (partial_append(c, p, take) != 0) return;
    p += take;
    n -= take;
  }
  while (n) {
    int r = frame_header(p, n, &hdr, &len);
    if (r < 0) {
      bad_header(c, r);
      return;
    }
    if (r == 0 || n - hdr < len) {
      partial_append(c, p, n);
      return;
    }
    handle_frame(c, p[0], p + hdr, (size_t)len);
    if (c->state != WSC_OPEN) return;
    p += hdr + len;
    n -= hdr + (size_t)len;
  }
}

static void on_open(wsc_t *c) {
  bench_t *b = c->b;
  c->state = WSC_OPEN;
  b->opening--;
  b->nopen++;
  if (b->auto_hello) send_hello(c);
  maybe_done(b);
}

static void open_more(bench_t *b);

/* Collect the answer to the upgrade; after its blank line the connection
 * is open and what followed it stays in `partial` for frames_feed. */
static void upgrade_feed(wsc_t *c, const uint8_t *p, size_t n) {
  if (partial_append(c, p, n) != 0) return;
  const uint8_t *end = memmem(c->partial, c->plen, "\r\n\r\n", 4);
  if (!end) {
    if (c->plen > UPGRADE_MAX) ws_lost(c, "an upgrade answer larger than 8 KiB");
    return;
  }
  if (c->plen < 12 || memcmp(c->partial, "HTTP/1.1 101", 12) != 0) {
    const uint8_t *eol = memmem(c->partial, c->plen, "\r\n", 2);
    char why[200];
    snprintf(why, sizeof why, "upgrade refused: %.*s",
             (int)(eol - c->partial > 150 ? 150 : eol - c->partial), (const char *)c->partial);
    ws_lost(c, why);
    return;
  }
  size_t head = (size_t)(end + 4 - c->partial);
  memmove(c->partial, c->partial + head, c->plen - head);
  c->plen -= (uint32_t)head;
  on_open(c);
  open_more(c->b);
}

static void ws_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  wsc_t *c = container_of((uv_tcp_t *)h, wsc_t, tcp);
  buf->base = c->b->read_buf;
  buf->len = sizeof c->b->read_buf;
}

static void ws_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  wsc_t *c = container_of((uv_tcp_t *)s, wsc_t, tcp);
  if (nread == 0) return;
  if (nread < 0) {
    ws_lost(c, nread == UV_EOF ? "the node closed the connection" : uv_strerror((int)nread));
    return;
  }
  if (c->state == WSC_UPGRADING) {
    upgrade_feed(c, (const uint8_t *)buf->base, (size_t)nread);
    if (c->state == WSC_OPEN && c->plen) frames_feed(c, NULL, 0);
    return;
  }
  if (c->state == WSC_OPEN) frames_feed(c, (const uint8_t *)buf->base, (size_t)nread);
}

static void ws_connect_cb(uv_connect_t *req, int status) {
  wsc_t *c = container_of(req, wsc_t, creq);
  bench_t *b = c->b;
  if (status == UV_ECANCELED || b->closing) return;
  if (status < 0) {
    ws_lost(c, uv_strerror(status));
    return;
  }
  c->state = WSC_UPGRADING;
  int r = uv_read_start((uv_stream_t *)&c->tcp, ws_alloc_cb, ws_read_cb);
  if (r != 0) {
    ws_lost(c, uv_strerror(r));
    return;
  }
  uint64_t k[2] = {jitter_next(&b->rng), jitter_next(&b->rng)};
  char key[32], text[512];
  EVP_EncodeBlock((unsigned char *)key, (const unsigned char *)k, 16); /* 24 chars, "==" */
  int n = snprintf(text, sizeof text,
                   "GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n"
                   "Sec-WebSocket-Protocol: converger.v1\r\n\r\n",
                   b->port, key);
  stream_send(b, (uv_stream_t *)&c->tcp, text, (size_t)n);
}

/* Start connections until OPEN_WINDOW are connecting or upgrading. */
static void open_more(bench_t *b) {
  struct sockaddr_in addr;
  uv_ip4_addr("127.0.0.1", b->port, &addr);
  while (!b->failed && b->opening < OPEN_WINDOW && b->next_open < b->nws) {
    wsc_t *c = &b->ws[b->next_open++];
    int r = uv_tcp_init(&b->loop, &c->tcp);
    if (r != 0) {
      fail(b, "%s: connection %u: %s", b->phase, c->index, uv_strerror(r));
      return;
    }
    c->handle = 1;
    b->handles++;
    c->state = WSC_CONNECTING;
    b->opening++;
    r = uv_tcp_connect(&c->creq, &c->tcp, (const struct sockaddr *)&addr, ws_connect_cb);
    if (r != 0) {
      ws_lost(c, uv_strerror(r));
      return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
  }
}

static void reset_counters(bench_t *b) {
  b->opening = b->nopen = b->nsynced = b->next_open = 0;
  b->msgs = b->seq_errors = 0;
  b->rest_connected = b->rest_answers = 0;
  b->want_open = b->want_synced = b->want_rest_connected = b->want_rest_answers = 0;
  b->want_msgs = 0;
  b->msgs_done_ns = b->rest_done_ns = b->done_ns = b->hold_until_ns = 0;
}

/* A new set of `n` connections (none opened yet: see open_more). */
static int ws_set_begin(bench_t *b, size_t n, int auto_hello, int fanout, int64_t watermark) {
  reset_counters(b);
  b->ws = calloc(n, sizeof *b->ws);
  if (!b->ws) {
    fail(b, "out of memory for %zu connections", n);
    return -1;
  }
  b->nws = n;
  b->auto_hello = auto_hello;
  b->fanout = fanout;
  b->hello_watermark = watermark;
  for (size_t i = 0; i < n; i++) {
    b->ws[i].b = b;
    b->ws[i].index = (uint32_t)i;
    b->ws[i].seq = -1;
  }
  return 0;
}

static void ws_close_cb(uv_handle_t *h) {
  wsc_t *c = container_of((uv_tcp_t *)h, wsc_t, tcp);
  c->b->handles--;
}

/* Close every connection of the set with RST (no close handshake, no
 * TIME_WAIT) and free it. */
static void ws_set_end(bench_t *b) {
  if (!b->ws) return;
  b->closing = 1;
  size_t left = b->handles;
  for (size_t i = 0; i < b->nws; i++) {
    wsc_t *c = &b->ws[i];
    if (!c->handle) continue;
    c->handle = 0;
    left--;
    if (uv_tcp_close_reset(&c->tcp, ws_close_cb) != 0)
      uv_close((uv_handle_t *)&c->tcp, ws_close_cb);
  }
  drain_closes(b, left);
  for (size_t i = 0; i < b->nws; i++) free(b->ws[i].partial);
  free(b->ws);
  b->ws = NULL;
  b->nws = 0;
  free(b->lat);
  b->lat = NULL;
  b->nlat = 0;
  b->closing = 0;
}

/* ---- REST connections of the delivery phase -------------------------------------- */

static int rest_on_begin(llhttp_t *p) {
  ((restc_t *)p->data)->blen = 0;
  return 0;
}

static int rest_on_body(llhttp_t *p, const char *at, size_t len) {
  restc_t *r = p->data;
  size_t room = sizeof r->body - 1 - r->blen;
  size_t n = len < room ? len : room;
  memcpy(r->body + r->blen, at, n);
  r->blen += n;
  r->body[r->blen] = '\0';
  return 0;
}

static int rest_on_complete(llhttp_t *p) {
  restc_t *r = p->data;
  bench_t *b = r->b;
  int st = llhttp_get_status_code(p);
  if (st != 201) {
    r->body[r->blen] = '\0';
    fail(b, "%s: an append answered %d: %s", b->phase, st, r->body);
    return 0;
  }
  if (++b->rest_answers == b->want_rest_answers) b->rest_done_ns = now_ns();
  maybe_done(b);
  return 0;
}

static void rest_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  restc_t *r = container_of((uv_tcp_t *)h, restc_t, tcp);
  buf->base = r->b->read_buf;
  buf->len = sizeof r->b->read_buf;
}

static void rest_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  restc_t *r = container_of((uv_tcp_t *)s, restc_t, tcp);
  bench_t *b = r->b;
  if (nread == 0) return;
  if (nread < 0) {
    uv_read_stop(s);
    if (!b->closing)
      fail(b, "%s: REST connection: %s", b->phase,
           nread == UV_EOF ? "closed by the node" : uv_strerror((int)nread));
    return;
  }
  llhttp_errno_t e = llhttp_execute(&r->parser, buf->base, (size_t)nread);
  if (e != HPE_OK)
    fail(b, "%s: bad REST answer: %s", b->phase, llhttp_get_error_reason(&r->parser));
}

static void rest_connect_cb(uv_connect_t *req, int status) {
  restc_t *r = container_of(req, restc_t, creq);
  bench_t *b = r->b;
  if (status == UV_ECANCELED || b->closing) return;
  int e = status < 0 ? status : uv_read_start((uv_stream_t *)&r->tcp, rest_alloc_cb, rest_read_cb);
  if (e != 0) {
    fail(b, "%s: REST connection: %s", b->phase, uv_strerror(e));
    return;
  }
  b->rest_connected++;
  maybe_done(b);
}

static int rest_begin(bench_t *b) {
  static llhttp_settings_t settings;
  static int settings_ready;
  if (!settings_ready) {
    llhttp_settings_init(&settings);
    settings.on_message_begin = rest_on_begin;
    settings.on_body = rest_on_body;
    settings.on_message_complete = rest_on_complete;
    settings_ready = 1;
  }
  struct sockaddr_in addr;
  uv_ip4_addr("127.0.0.1", b->port, &addr);
  if (!(b->rest = calloc((size_t)b->rest_conns, sizeof *b->rest))) {
    fail(b, "out of memory");
    return -1;
  }
  for (int i = 0; i < b->rest_conns; i++) {
    restc_t *r = &b->rest[i];
    r->b = b;
    llhttp_init(&r->parser, HTTP_RESPONSE, &settings);
    r->parser.data = r;
    int e = uv_tcp_init(&b->loop, &r->tcp);
    if (e == 0) {
      r->handle = 1;
      b->handles++;
      e = uv_tcp_connect(&r->creq, &r->tcp, (const struct sockaddr *)&addr, rest_connect_cb);
    }
    if (e != 0) {
      fail(b, "REST connection: %s", uv_strerror(e));
      return -1;
    }
    uv_tcp_nodelay(&r->tcp, 1);
  }
  return 0;
}

static void rest_close_cb(uv_handle_t *h) {
  restc_t *r = container_of((uv_tcp_t *)h, restc_t, tcp);
  r->b->handles--;
}

static void rest_end(bench_t *b) {
  b->closing = 1;
  size_t left = b->handles;
  for (int i = 0; b->rest && i < b->rest_conns; i++) {
    restc_t *r = &b->rest[i];
    if (!r->handle) continue;
    r->handle = 0;
    left--;
    if (uv_tcp_close_reset(&r->tcp, rest_close_cb) != 0)
      uv_close((uv_handle_t *)&r->tcp, rest_close_cb);
  }
  drain_closes(b, left);
  free(b->rest);
  b->rest = NULL;
  b->closing = 0;
}

/* ---- the three phases ---------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int phase_memory(bench_t *b, results_t *res) {
  size_t n = (size_t)b->conns;
  fprintf(stderr, "memory: opening %zu connections, one subscription each (watermark null)\n", n);
  long before = proc_status_kb(b->pid, "VmRSS");
  if (before < 0) {
    fail(b, "cannot read VmRSS of the node (pid %d)", (int)b->pid);
    return -1;
  }
  b->phase = "memory: connecting";
  if (ws_set_begin(b, n, 1, 0, -1) != 0) return -1;
  b->want_open = b->want_synced = n;
  uint64_t t0 = now_ns();
  open_more(b);
  if (run_phase(b, "memory: connecting") != 0) return -1;
  double open_s = (double)(b->done_ns - t0) / NS;
  b->hold_until_ns = now_ns() + (uint64_t)SETTLE_MS * 1000000u;
  if (run_phase(b, "memory: settling") != 0) return -1;
  long ws = 0, http = 0, subs = 0;
  if (node_counts(b, &ws, &http, &subs) != 0) return -1;
  long after = proc_status_kb(b->pid, "VmRSS");
  if (ws != (long)n || subs != (long)n) {
    fail(b, "memory: the node counts %ld connections and %ld subscriptions, want %zu", ws, subs, n);
    return -1;
  }
  res->rss_before_kb = before;
  res->rss_after_kb = after;
  res->bytes_per_conn = (double)(after - before) * 1024.0 / (double)n;
  res->have_memory = 1;
  double miss = res->bytes_per_conn - 4096;
  char verdict[64];
  if (miss <= 0)
    snprintf(verdict, sizeof verdict, "met");
  else
    snprintf(verdict, sizeof verdict, "MISSED by %.0f bytes, %.0f%%", miss, miss / 4096 * 100);
  printf("memory: %zu idle connections (welcomed and synced in %.2f s): node VmRSS %.1f MiB -> "
         "%.1f MiB: %.0f bytes per connection (target <= 4096: %s)\n",
         n, open_s, before / 1024.0, after / 1024.0, res->bytes_per_conn, verdict);
  fflush(stdout);
  ws_set_end(b);
  return wait_node_idle(b);
}

/* One round of K hellos on upgraded connections; watermark -1 is null. */
static int phase_handshakes(bench_t *b, int64_t watermark, results_t *res) {
  size_t k = (size_t)b->handshakes;
  int round = watermark < 0;
  const char *what = round ? "watermark null" : "one-message replay";
  fprintf(stderr, "handshakes (%s): upgrading %zu connections\n", what, k);
  b->phase = "handshakes: upgrading";
  if (ws_set_begin(b, k, 0, 0, watermark) != 0) return -1;
  b->want_open = k;
  open_more(b);
  if (run_phase(b, "handshakes: upgrading") != 0) return -1;
  if (!(b->lat = calloc(k, sizeof *b->lat))) {
    fail(b, "out of memory");
    return -1;
  }
  b->want_synced = k;
  b->want_msgs = watermark < 0 ? 0 : (uint64_t)k * (uint64_t)(SETUP_HEAD - watermark);
  b->phase = "handshakes: sending hello";
  cpu_snap_t c0, c1;
  cpu_snap(b, &c0);
  uint64_t t0 = now_ns();
  for (size_t i = 0; i < k && !b->failed; i++) send_hello(&b->ws[i]);
  uint64_t sent_ns = now_ns();
  if (run_phase(b, "handshakes: waiting for welcome and synced") != 0) return -1;
  cpu_snap(b, &c1);
  if (b->msgs != b->want_msgs || b->seq_errors) {
    fail(b, "handshakes: %llu replayed messages (want %llu), %llu out of order",
         (unsigned long long)b->msgs, (unsigned long long)b->want_msgs,
         (unsigned long long)b->seq_errors);
    return -1;
  }
  double s = (double)(b->done_ns - t0) / NS;
  qsort(b->lat, b->nlat, sizeof *b->lat, cmp_u64);
  double p50 = (double)b->lat[b->nlat / 2] / 1e6;
  double p99 =
      (double)b->lat[b->nlat * 99 / 100 < b->nlat ? b->nlat * 99 / 100 : b->nlat - 1] / 1e6;
  char cpu[160];
  double node_s = cpu_text(&c0, &c1, cpu, sizeof cpu);
  res->hs_rate[round] = (double)k / s;
  res->have_hs[round] = 1;
  printf("handshakes (%s): %zu hello -> welcome%s + synced in %.3f s (hellos written in %.0f ms): "
         "%.0f/s",
         what, k, round ? "" : " + 1 replayed msg", s, (double)(sent_ns - t0) / 1e6,
         res->hs_rate[round]);
  if (!round) printf(" (target >= 10000: %s)", res->hs_rate[round] >= 10000 ? "met" : "MISSED");
  printf("; latency p50 %.0f ms, p99 %.0f ms; %s, %.0f us node CPU per handshake\n", p50, p99, cpu,
         node_s * 1e6 / (double)k);
  fflush(stdout);
  ws_set_end(b);
  return wait_node_idle(b);
}

static int phase_deliveries(bench_t *b, results_t *res) {
  size_t s = (size_t)b->subs, m = (size_t)b->messages;
  fprintf(stderr, "deliveries: subscribing %zu connections to one conversation\n", s);
  b->phase = "deliveries: subscribing";
  if (ws_set_begin(b, s, 1, 1, -1) != 0) return -1;
  b->want_open = b->want_synced = s;
  open_more(b);
  if (run_phase(b, "deliveries: subscribing") != 0) return -1;
  size_t nrest = (size_t)b->rest_conns;
  b->want_rest_connected = nrest;
  b->phase = "deliveries: connecting REST";
  if (rest_begin(b) != 0 || run_phase(b, "deliveries: connecting REST") != 0) return -1;

  /* Every request written at once, message i on connection i % nrest. The
   * body {"text":"xx...x"} is BODY_BYTES long. */
  char text[BODY_BYTES - 11 + 1];
  memset(text, 'x', sizeof text - 1);
  text[sizeof text - 1] = '\0';
  char body[256];
  int blen = snprintf(body, sizeof body, "{\"sender\":\"bench\",\"body\":{\"text\":\"%s\"}}", text);
  size_t per = (m + nrest - 1) / nrest, cap = per * 512 + 1;
  char *reqs = malloc(nrest * cap); /* one slice of `cap` bytes per connection */
  size_t *lens = calloc(nrest, sizeof *lens);
  if (!reqs || !lens) {
    fail(b, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < m; i++) {
    size_t r = i % nrest;
    lens[r] += (size_t)snprintf(reqs + r * cap + lens[r], cap - lens[r],
                                "POST /v1/conversations/bench-fanout/messages HTTP/1.1\r\n"
                                "Host: 127.0.0.1:%d\r\nAuthorization: Bearer %s\r\n"
                                "Content-Type: application/json\r\nIdempotency-Key: bench-%zu\r\n"
                                "Content-Length: %d\r\n\r\n%s",
                                b->port, b->api_key, i, blen, body);
  }
  b->want_msgs = (uint64_t)s * m;
  b->want_rest_answers = m;
  b->phase = "deliveries: appending";
  cpu_snap_t c0, c1;
  cpu_snap(b, &c0);
  uint64_t t0 = now_ns();
  for (size_t i = 0; i < nrest && !b->failed; i++)
    if (lens[i]) stream_send(b, (uv_stream_t *)&b->rest[i].tcp, reqs + i * cap, lens[i]);
  if (run_phase(b, "deliveries: appending and delivering") != 0) goto out;
  cpu_snap(b, &c1);
  if (b->seq_errors) {
    fail(b, "deliveries: %llu messages out of order", (unsigned long long)b->seq_errors);
    goto out;
  }
  double secs = (double)(b->msgs_done_ns - t0) / NS;
  char cpu[160];
  double node_s = cpu_text(&c0, &c1, cpu, sizeof cpu);
  res->deliveries = (double)b->want_msgs / secs;
  res->have_deliveries = 1;
  printf("deliveries: %zu subscribers x %zu messages (%d-byte bodies) = %llu in %.3f s: %.0f/s "
         "(target >= 500000: %s); appends answered in %.0f ms over %d pipelined connections; %s, "
         "%.2f us node CPU per delivery\n",
         s, m, BODY_BYTES, (unsigned long long)b->want_msgs, secs, res->deliveries,
         res->deliveries >= 500000 ? "met" : "MISSED", (double)(b->rest_done_ns - t0) / 1e6,
         b->rest_conns, cpu, node_s * 1e6 / (double)b->want_msgs);
  fflush(stdout);
out:
  free(reqs);
  free(lens);
  rest_end(b);
  ws_set_end(b);
  return b->failed ? -1 : 0;
}

/* ---- main ---------------------------------------------------------------------- */

static void on_signal(int sig) { interrupted = sig; }

static void cpu_name(int cpu, char out[32]) {
  if (cpu >= 0)
    snprintf(out, 32, "CPU %d", cpu);
  else
    snprintf(out, 32, "no CPU pinning");
}

static void cell(int have, double v, char out[32]) {
  if (have)
    snprintf(out, 32, "%.0f", v);
  else
    snprintf(out, 32, "-");
}

static void print_table(bench_t *b, const results_t *r) {
  char c[4][32];
  cell(r->have_memory, r->bytes_per_conn, c[0]);
  cell(r->have_hs[0], r->hs_rate[0], c[1]);
  cell(r->have_hs[1], r->hs_rate[1], c[2]);
  cell(r->have_deliveries, r->deliveries, c[3]);
  printf("\n| conns | bytes/conn | handshakes | hs/s (1-msg replay) | hs/s (null) | subs x msgs | "
         "deliveries/s |\n| ---: | ---: | ---: | ---: | ---: | --- | ---: |\n"
         "| %d | %s | %d | %s | %s | %d x %d | %s |\n",
         b->conns, c[0], b->handshakes, c[1], c[2], b->subs, b->messages, c[3]);
  fflush(stdout);
}

int bench_baseline_main(int argc, char **argv) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
    fprintf(stderr, "converger bench baseline: sched_getaffinity: %s\n", strerror(errno));
    return 1;
  }
  bench_t *b = calloc(1, sizeof *b);
  if (!b) return 1;
  int cpus[2] = {-1, -1}, ncpu = 0;
  for (int i = 0; i < CPU_SETSIZE && ncpu < 2; i++)
    if (CPU_ISSET(i, &allowed)) cpus[ncpu++] = i;
  b->conns = 10000;
  b->handshakes = 5000;
  b->subs = 5000;
  b->messages = 200;
  b->rest_conns = 16;
  b->node_cpu = cpus[0];
  b->client_cpu = cpus[1];
  b->timeout_s = 60;
  b->phase = "setup";
  int r = parse_options(b, argc, argv, &allowed);
  if (r != 0) {
    free(b);
    return r > 0 ? 0 : 2;
  }

  /* Descriptors: the child inherits the raised limit. */
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rlim_t hard = rl.rlim_max == RLIM_INFINITY ? 1048576 : rl.rlim_max;
  rl.rlim_cur = hard;
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0) getrlimit(RLIMIT_NOFILE, &rl);
  long need = b->conns;
  if (b->handshakes > need) need = b->handshakes;
  if (b->subs > need) need = b->subs;
  if ((rlim_t)(need + FDS_SPARE) > rl.rlim_cur) {
    fprintf(stderr,
            "converger bench baseline: %ld connections need %ld descriptors per process; "
            "RLIMIT_NOFILE allows %llu\n",
            need, need + FDS_SPARE, (unsigned long long)rl.rlim_cur);
    free(b);
    return 2;
  }

  struct sigaction sa, old_int, old_term, old_hup;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGHUP, &sa, &old_hup);
  signal(SIGPIPE, SIG_IGN);
  interrupted = 0;
  jitter_seed_random(&b->rng);

  results_t res = {0};
  int status = 1;
  if (node_start(b) != 0) goto out;
  if (b->client_cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(b->client_cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
      fail(b, "cannot pin the bench to CPU %d: %s", b->client_cpu, strerror(errno));
      goto out;
    }
  }
  char node_cpu[32], client_cpu[32];
  cpu_name(b->node_cpu, node_cpu);
  cpu_name(b->client_cpu, client_cpu);
  printf("converger bench baseline: node pid %d (%s serve) on 127.0.0.1:%d, %s; bench on %s; "
         "RLIMIT_NOFILE %llu\n",
         (int)b->pid, b->exe, b->port, node_cpu, client_cpu, (unsigned long long)rl.rlim_cur);
  fflush(stdout);
  if (uv_loop_init(&b->loop) != 0) {
    fail(b, "uv_loop_init failed");
    goto out;
  }
  b->loop_ready = 1;
  uv_timer_init(&b->loop, &b->watch);
  uint64_t t0 = now_ns();
  if (wait_ready(b) != 0 || setup(b) != 0) goto out;
  fprintf(stderr,
          "setup: node ready, %d conversations with %d messages each, token minted (%.1f s)\n",
          CONVS, SETUP_HEAD, (double)(now_ns() - t0) / NS);
  if (phase_memory(b, &res) != 0) goto out;
  if (phase_handshakes(b, SETUP_HEAD - 1, &res) != 0) goto out;
  if (phase_handshakes(b, -1, &res) != 0) goto out;
  if (phase_deliveries(b, &res) != 0) goto out;
  status = 0;
out:
  if (b->failed) {
    fprintf(stderr, "converger bench baseline: FAILED: %s\n", b->err);
    print_node_log_tail(b, 20);
  }
  if (res.have_memory || res.have_hs[0] || res.have_deliveries) print_table(b, &res);
  if (b->loop_ready) {
    rest_end(b);
    ws_set_end(b);
    uv_close((uv_handle_t *)&b->watch, NULL);
    for (int i = 0; i < 8 && uv_loop_alive(&b->loop); i++) uv_run(&b->loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&b->loop) != 0)
      fprintf(stderr, "converger bench baseline: the loop closed with open handles\n");
  }
  node_stop(b);
  remove_dir(b);
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  sigaction(SIGHUP, &old_hup, NULL);
  free(b->token);
  free(b);
  return status;
}

/* The dispatcher lives here while baseline is the only benchmark. */
int bench_main(int argc, char **argv) {
  if (argc >= 1 && strcmp(argv[0], "baseline") == 0) return bench_baseline_main(argc - 1, argv + 1);
  FILE *out = argc >= 1 && (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0 ||
                            strcmp(argv[0], "help") == 0)
                  ? stdout
                  : stderr;
  if (argc >= 1 && out == stderr)
    fprintf(stderr, "converger bench: unknown benchmark \"%s\"\n\n", argv[0]);
  fprintf(out, "usage: converger bench <benchmark> [options]\n\n"
               "benchmarks:\n"
               "  baseline  memory per idle connection, handshakes/s, deliveries/s of one node\n"
               "            (converger bench baseline --help)\n");
  return out == stdout ? 0 : 2;
}
