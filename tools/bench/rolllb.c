/*
 * rolllb: see rolllb.h.
 */
#include "bench/rolllb.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/node.h"
#include "bench/restc.h"
#include "bench/run.h"

#define READY_WAIT_MS 10000
#define STOP_WAIT_MS  5000

int rolllb_init(rolllb_t *lb, char *err, size_t errlen) {
  memset(lb, 0, sizeof *lb);
  if ((lb->port = bnode_free_port()) < 0) {
    run_set_err(err, errlen, "cannot find a free loopback port for HAProxy: %s", strerror(errno));
    return -1;
  }
  return 0;
}

static int write_cfg(const rolllb_t *lb, const int *ports, size_t n, char *err, size_t errlen) {
  char path[4200];
  snprintf(path, sizeof path, "%s/haproxy.cfg", lb->dir);
  FILE *f = fopen(path, "w");
  if (!f) {
    run_set_err(err, errlen, "%s: %s", path, strerror(errno));
    return -1;
  }
  fprintf(f,
          "# Written by converger bench roll --lb haproxy for one run: the settings of\n"
          "# deploy/haproxy/converger.cfg (see there why), with checks every 250 ms so\n"
          "# that a draining node leaves the rotation within about 0.5-0.75 s, one\n"
          "# frontend on a free loopback port and no stats page.\n"
          "# No log section: HAProxy's own warnings (servers going down and up) go to\n"
          "# stderr, which is haproxy.log.\n"
          "defaults\n"
          "    mode http\n"
          "    option http-keep-alive\n"
          "    timeout connect 5s\n"
          "    timeout http-request 10s\n"
          "    timeout http-keep-alive 10s\n"
          "    timeout client 30s\n"
          "    timeout server 30s\n"
          "    timeout tunnel 1h\n"
          "    timeout client-fin 30s\n"
          "    timeout server-fin 30s\n"
          "\n"
          "frontend converger\n"
          "    bind 127.0.0.1:%d\n"
          "    default_backend converger_nodes\n"
          "\n"
          "backend converger_nodes\n"
          "    balance leastconn\n"
          "    retries 2\n"
          "    option redispatch 1\n"
          "    option httpchk\n"
          "    http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host converger\n"
          "    http-check expect status 200\n"
          "    default-server check inter 250ms fall 2 rise 2\n",
          lb->port);
  for (size_t i = 0; i < n; i++) fprintf(f, "    server roll-%zu 127.0.0.1:%d\n", i, ports[i]);
  if (fclose(f) != 0) {
    run_set_err(err, errlen, "%s: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

/* The last line of DIR/haproxy.log, for an error message. */
static void log_tail(const rolllb_t *lb, char *out, size_t len) {
  char path[4200], buf[2048];
  snprintf(path, sizeof path, "%s/haproxy.log", lb->dir);
  out[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f) return;
  if (fseek(f, -(long)(sizeof buf - 1), SEEK_END) != 0) rewind(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = '\0';
  char *nl = strrchr(buf, '\n');
  const char *last = nl ? nl + 1 : buf;
  size_t m = strlen(last) < len - 1 ? strlen(last) : len - 1;
  memcpy(out, last, m);
  out[m] = '\0';
}

/* 1 when HAProxy has exited (reaped now; *status set), 0 while it runs. */
static int exited(rolllb_t *lb, int *status) {
  pid_t r = waitpid(lb->pid, status, WNOHANG);
  if (r == lb->pid || (r < 0 && errno == ECHILD)) {
    lb->pid = 0;
    return 1;
  }
  return 0;
}

int rolllb_start(rolllb_t *lb, const char *dir, const int *ports, size_t n, char *err,
                 size_t errlen) {
  snprintf(lb->dir, sizeof lb->dir, "%s", dir);
  if (write_cfg(lb, ports, n, err, errlen) != 0) return -1;
  char cfg[4200], log[4200];
  snprintf(cfg, sizeof cfg, "%s/haproxy.cfg", dir);
  snprintf(log, sizeof log, "%s/haproxy.log", dir);
  int log_fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    run_set_err(err, errlen, "%s: %s", log, strerror(errno));
    return -1;
  }
  /* its own process group: a Ctrl-C reaches the bench, which stops it */
  char *args[] = {(char *)"haproxy", (char *)"-db", (char *)"-f", cfg, NULL};
  run_spawn_opts_t so = {
      .out_fd = log_fd, .err_fd = log_fd, .death_sig = SIGKILL, .own_group = 1, .cpu = -1};
  pid_t pid = run_spawn(args, &so);
  int fork_errno = errno;
  close(log_fd);
  if (pid < 0) {
    run_set_err(err, errlen, "fork: %s", strerror(fork_errno));
    return -1;
  }
  lb->pid = pid;

  bench_t *b = calloc(1, sizeof *b);
  if (!b) {
    run_set_err(err, errlen, "out of memory");
    rolllb_stop(lb);
    return -1;
  }
  b->port = lb->port;
  uint64_t t0 = run_now_ns();
  int rc = -1, st = 0, status = 0;
  char out[256], tail[300];
  for (;;) {
    if (exited(lb, &status)) {
      if (WIFEXITED(status) && WEXITSTATUS(status) == RUN_EXEC_FAILED)
        run_set_err(err, errlen, "haproxy not found (scripts/setup installs the Debian package)");
      else {
        log_tail(lb, tail, sizeof tail);
        run_set_err(err, errlen, "haproxy exited at start (%s): %s",
                    bnode_status_text(status, out, sizeof out), tail[0] ? tail : "no log");
      }
      break;
    }
    st = restc_call(b, "GET", "/readyz", NULL, NULL, out, sizeof out);
    if (st == 200) {
      rc = 0;
      break;
    }
    if (run_interrupted || run_now_ns() - t0 > (uint64_t)READY_WAIT_MS * 1000000u) {
      run_set_err(err, errlen, "HAProxy on port %d: GET /readyz answered %d within %d ms (%s)",
                  lb->port, st, READY_WAIT_MS, st < 0 ? b->http_err : out);
      break;
    }
    run_sleep_ms(50);
  }
  free(b);
  if (rc != 0) rolllb_stop(lb);
  return rc;
}

void rolllb_stop(rolllb_t *lb) {
  if (lb->pid <= 0) return;
  int killed;
  run_stop_child(lb->pid, STOP_WAIT_MS, &killed);
  if (killed)
    fprintf(stderr, "HAProxy (pid %d) still running %d ms after SIGTERM: SIGKILL\n", (int)lb->pid,
            STOP_WAIT_MS);
  lb->pid = 0;
}
