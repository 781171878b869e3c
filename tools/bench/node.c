/*
 * node.c: start, readiness, /proc readings and stop of the node a bench
 * run measures (see bench/node.h).
 */
#include "bench/node.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/restc.h"
#include "bench/tlscert.h"
#include "common/util.h"

#define READY_WAIT_MS 30000
#define IDLE_WAIT_MS  30000 /* for the node to drop the closed connections */
#define STOP_WAIT_MS  10000 /* SIGTERM, then SIGKILL */

/* ---- the node: start, readiness, /proc readings, stop ------------------------------ */

const char *bnode_status_text(int st, char *buf, size_t len) {
  if (WIFEXITED(st))
    snprintf(buf, len, "exit status %d", WEXITSTATUS(st));
  else if (WIFSIGNALED(st))
    snprintf(buf, len, "killed by signal %d, %s", WTERMSIG(st), strsignal(WTERMSIG(st)));
  else
    snprintf(buf, len, "wait status %d", st);
  return buf;
}

/* 1 when the node is not running (exited, reaped now or before). */
int bnode_gone(bench_t *b) {
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

int bnode_free_port(void) {
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

/* 1 when the inherited `var` ("NAME=value") is a setting the bench decides:
 * CONVERGER_*, WS_HANDSHAKE_*, or a name that `extra` sets. */
static int env_replaced(const char *var, const char *const *extra) {
  if (strncmp(var, "CONVERGER_", 10) == 0 || strncmp(var, "WS_HANDSHAKE_", 13) == 0) return 1;
  for (size_t i = 0; extra && extra[i]; i++) {
    const char *eq = strchr(extra[i], '=');
    size_t nl = eq ? (size_t)(eq - extra[i]) : strlen(extra[i]);
    if (strncmp(var, extra[i], nl) == 0 && var[nl] == '=') return 1;
  }
  return 0;
}

/* 1 when `extra` sets the variable of `var` ("NAME=value"). */
static int extra_sets(const char *var, const char *const *extra) {
  const char *eq = strchr(var, '=');
  size_t nl = eq ? (size_t)(eq - var) : strlen(var);
  for (size_t i = 0; extra && extra[i]; i++)
    if (strncmp(extra[i], var, nl) == 0 && extra[i][nl] == '=') return 1;
  return 0;
}

/* The child's environment: ours without CONVERGER_* and WS_HANDSHAKE_*
 * settings, plus the bench's, then `extra`. A name appears once: `extra`
 * wins over the bench's own settings (getenv would return the first of two).
 * NULL-terminated; free each string and the array. */
static char **node_env(bench_t *b, const char *const *extra) {
  extern char **environ;
  size_t n = 0, nextra = 0;
  while (environ[n]) n++;
  while (extra && extra[nextra]) nextra++;
  char **env = calloc(n + nextra + 16, sizeof *env);
  if (!env) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (!env_replaced(environ[i], extra)) env[k++] = strdup(environ[i]);
  size_t base = k; /* the bench's own settings start here */
  env[k++] = run_str_printf("CONVERGER_LISTEN=127.0.0.1:%d", b->port);
  env[k++] = run_str_printf("CONVERGER_DATABASE_URL=sqlite:%s/c.db", b->dir);
  env[k++] = run_str_printf("CONVERGER_API_KEY=%s", b->api_key);
  env[k++] = run_str_printf("CONVERGER_TOKEN_SECRET=%s", b->secret);
  env[k++] = strdup("CONVERGER_SQLITE_SYNC=off");         /* benchmark only */
  env[k++] = strdup("CONVERGER_HEARTBEAT_MS=3600000");    /* no pings while measuring */
  env[k++] = strdup("CONVERGER_HELLO_TIMEOUT_MS=600000"); /* upgraded sockets wait for hello */
  env[k++] = strdup("CONVERGER_NODE_ID=bench");
  env[k++] = strdup("CONVERGER_DRAIN_SHUTDOWN_MS=0"); /* SIGTERM at the end: no drain */
  /* one port for everything: the bench reads /metrics and /admin/status
   * where it sends (and several nodes share the machine) */
  env[k++] = strdup("CONVERGER_ADMIN_LISTEN=");
  if (b->tls) {
    env[k++] = run_str_printf("CONVERGER_TLS_CERT=%s", b->tls_cert);
    env[k++] = run_str_printf("CONVERGER_TLS_KEY=%s", b->tls_key);
  }
  /* The bench's own settings that `extra` replaces. Every slot is still
   * non-NULL here unless strdup failed, which the check below catches. */
  size_t kept = base;
  for (size_t i = base; i < k; i++) {
    if (env[i] && extra_sets(env[i], extra)) {
      free(env[i]);
      continue;
    }
    env[kept++] = env[i];
  }
  for (size_t i = kept; i < k; i++) env[i] = NULL;
  k = kept;
  for (size_t i = 0; i < nextra; i++) env[k++] = strdup(extra[i]);
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

int bnode_start(bench_t *b) { return bnode_start_env(b, NULL); }

int bnode_start_env(bench_t *b, const char *const *extra_env) {
  /* CONVERGER_BENCH_NODE: the node of another build (the commit before,
   * side by side), driven by this bench */
  const char *other = getenv("CONVERGER_BENCH_NODE");
  if (other && *other) {
    if (strlen(other) >= sizeof b->exe || access(other, X_OK) != 0) {
      run_fail(b, "CONVERGER_BENCH_NODE=%s: not an executable file", other);
      return -1;
    }
    snprintf(b->exe, sizeof b->exe, "%s", other);
  } else {
    ssize_t n = readlink("/proc/self/exe", b->exe, sizeof b->exe - 1);
    if (n <= 0) {
      run_fail(b, "cannot read /proc/self/exe: %s", strerror(errno));
      return -1;
    }
    b->exe[n] = '\0';
  }
  const char *tmp = getenv("TMPDIR");
  if (!tmp || !*tmp || strlen(tmp) > 200) tmp = "/tmp";
  snprintf(b->dir, sizeof b->dir, "%s/converger-bench-XXXXXX", tmp);
  if (!mkdtemp(b->dir)) {
    run_fail(b, "cannot create a temporary directory %s: %s", b->dir, strerror(errno));
    b->dir[0] = '\0';
    return -1;
  }
  b->tls_cert[0] = b->tls_key[0] = '\0';
  if (b->tls) {
    char why[256];
    snprintf(b->tls_cert, sizeof b->tls_cert, "%s/tls.pem", b->dir);
    snprintf(b->tls_key, sizeof b->tls_key, "%s/tls.key", b->dir);
    if (tlscert_make(b->tls_cert, b->tls_key, why, sizeof why) != 0) {
      run_fail(b, "%s", why);
      return -1;
    }
  }
  if (!(b->keep_port && b->port > 0) && (b->port = bnode_free_port()) < 0) {
    run_fail(b, "cannot find a free loopback port: %s", strerror(errno));
    return -1;
  }
  if (!b->keep_keys &&
      (util_random_hex(b->api_key, 32) != 0 || util_random_hex(b->secret, 32) != 0)) {
    run_fail(b, "cannot generate the API key and token secret");
    return -1;
  }
  char log_path[PATH_MAX];
  snprintf(log_path, sizeof log_path, "%s/node.log", b->dir);
  int log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  char **env = node_env(b, extra_env);
  if (log_fd < 0 || !env) {
    run_fail(b, "cannot prepare the node's log or environment: %s", strerror(errno));
    if (log_fd >= 0) close(log_fd);
    env_free(env);
    return -1;
  }
  /* its own process group (a terminal's Ctrl-C reaches the bench only,
   * which then stops the node in order), killed if the bench dies */
  char *args[] = {b->exe, (char *)"serve", NULL};
  run_spawn_opts_t so = {.env = env,
                         .out_fd = log_fd,
                         .err_fd = log_fd,
                         .death_sig = SIGKILL,
                         .own_group = 1,
                         .cpu = b->node_cpu};
  pid_t pid = run_spawn(args, &so);
  int fork_errno = errno;
  close(log_fd);
  env_free(env);
  if (pid < 0) {
    run_fail(b, "fork: %s", strerror(fork_errno));
    return -1;
  }
  b->pid = pid;
  return 0;
}

void bnode_stop(bench_t *b) {
  if (b->pid <= 0) return;
  int killed;
  b->node_status = run_stop_child(b->pid, STOP_WAIT_MS, &killed);
  b->node_exited = 1;
  b->pid = 0;
  if (killed) {
    fprintf(stderr, "converger bench: the node did not stop within %d s; SIGKILL\n",
            STOP_WAIT_MS / 1000);
    return;
  }
  char why[96];
  if (!WIFEXITED(b->node_status) || WEXITSTATUS(b->node_status) != 0)
    fprintf(stderr, "converger bench: the node ended with %s after SIGTERM\n",
            bnode_status_text(b->node_status, why, sizeof why));
}

void bnode_print_log_tail(bench_t *b, int lines) {
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

void bnode_remove_dir(bench_t *b) {
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
long bnode_status_kb(pid_t pid, const char *name) {
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

void bnode_cpu_snap(bench_t *b, bnode_cpu_snap_t *s) {
  char path[96];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)b->pid);
  s->node_ticks = proc_ticks(path, &s->node_sys_ticks);
  snprintf(path, sizeof path, "/proc/%d/task/%d/stat", (int)b->pid, (int)b->pid);
  s->loop_ticks = proc_ticks(path, NULL);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  s->self_s = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
              ru.ru_stime.tv_usec / 1e6;
  s->ns = run_now_ns();
}

/* "node CPU 97% (loop thread 61%, store workers 36%; in the kernel 45%),
 * bench CPU 40%" over
 * the interval; returns the node's CPU seconds (-1 when unreadable). Clock
 * ticks are 10 ms, so short intervals read coarse. A node below ~95% while
 * the bench waits for it was not alone on its CPU. */
double bnode_cpu_text(const bnode_cpu_snap_t *a, const bnode_cpu_snap_t *z, char *out, size_t len) {
  double wall = (double)(z->ns - a->ns) / RUN_NS;
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

int bnode_wait_ready(bench_t *b) {
  uint64_t until = run_now_ns() + (uint64_t)READY_WAIT_MS * 1000000u;
  char body[256];
  for (;;) {
    int st = restc_call(b, "GET", "/readyz", NULL, NULL, body, sizeof body);
    if (st == 200) return 0;
    char why[96];
    if (bnode_gone(b)) {
      run_fail(b, "the node exited during start-up (%s)",
               bnode_status_text(b->node_status, why, sizeof why));
      return -1;
    }
    if (run_interrupted) {
      run_fail(b, "interrupted");
      return -1;
    }
    if (run_now_ns() >= until) {
      run_fail(b, "GET /readyz did not answer 200 within %d s (last: %s)", READY_WAIT_MS / 1000,
               st < 0 ? b->http_err : body);
      return -1;
    }
    run_sleep_ms(20);
  }
}

/* The node's count of WebSocket and HTTP connections (GET /admin/status). */
int bnode_counts(bench_t *b, long *ws, long *http, long *subs) {
  char body[1024];
  if (restc_expect(b, "GET", "/admin/status", NULL, NULL, 200, body, sizeof body) != 0) return -1;
  json_t *v = json_loads(body, 0, NULL);
  *ws = (long)json_integer_value(json_object_get(v, "connections"));
  *http = (long)json_integer_value(json_object_get(v, "httpConnections"));
  *subs = (long)json_integer_value(json_object_get(v, "subscriptions"));
  int ok = json_is_integer(json_object_get(v, "connections"));
  json_decref(v);
  if (!ok) run_fail(b, "GET /admin/status: no \"connections\" in %.200s", body);
  return ok ? 0 : -1;
}

/* Wait until the node has dropped every WebSocket connection of the last
 * phase (and no HTTP connection but ours is left), so that phases do not
 * overlap. */
int bnode_wait_idle(bench_t *b) {
  uint64_t until = run_now_ns() + (uint64_t)IDLE_WAIT_MS * 1000000u;
  long ws = 0, http = 0, subs = 0;
  for (;;) {
    if (bnode_counts(b, &ws, &http, &subs) != 0) return -1;
    if (ws == 0 && http <= 1) return 0;
    if (run_interrupted) {
      run_fail(b, "interrupted");
      return -1;
    }
    if (run_now_ns() >= until) {
      run_fail(b,
               "the node still counts %ld WebSocket and %ld HTTP connections %d s after the bench "
               "closed them",
               ws, http - 1, IDLE_WAIT_MS / 1000);
      return -1;
    }
    run_sleep_ms(20);
  }
}
