/*
 * pgtmp.c: scripts/pg-tmp driven from a bench (bench/pgtmp.h).
 */
#include "bench/pgtmp.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int pgtmp_run_script(const char *script, const char *dir, const char *arg1, const char *arg2,
                     const char *arg3, const char *arg4, char *out, size_t cap) {
  int fds[2] = {-1, -1};
  if (out && pipe2(fds, O_CLOEXEC) != 0) return -1;
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    if (out) dup2(fds[1], 1);
    setenv("PG_TMP_DIR", dir, 1);
    signal(SIGPIPE, SIG_DFL);
    execl(script, script, arg1, arg2, arg3, arg4, (char *)NULL);
    dprintf(2, "converger bench: cannot run %s: %s\n", script, strerror(errno));
    _exit(127);
  }
  if (out) close(fds[1]);
  if (pid < 0) {
    if (out) close(fds[0]);
    return -1;
  }
  size_t len = 0;
  while (out) {
    ssize_t n = read(fds[0], out + len, cap - 1 - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += (size_t)n;
    if (len == cap - 1) break;
  }
  if (out) {
    out[len] = '\0';
    close(fds[0]);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int pgtmp_start(const char *cmd, const char *script, int fast, char *dir, size_t dircap, char *url,
                size_t urlcap) {
  dir[0] = '\0';
  if (access(script, X_OK) != 0) {
    fprintf(stderr, "%s: cannot run %s (%s); give --pg-tmp PATH or --pg-url URL\n", cmd, script,
            strerror(errno));
    return -1;
  }
  const char *tmp = getenv("TMPDIR");
  if (!tmp || !*tmp || strlen(tmp) > 60) tmp = "/tmp";
  snprintf(dir, dircap, "%s/cvg-bench-pg-XXXXXX", tmp);
  if (!mkdtemp(dir)) {
    fprintf(stderr, "%s: cannot create %s: %s\n", cmd, dir, strerror(errno));
    dir[0] = '\0';
    return -1;
  }
  char owner[24], out[1024];
  snprintf(owner, sizeof owner, "%d", (int)getpid());
  fprintf(stderr, "postgres: starting a throwaway %s cluster (%s start%s, PG_TMP_DIR=%s)\n",
          fast ? "fast, not durable," : "durable", script, fast ? " --fast" : "", dir);
  int st = pgtmp_run_script(script, dir, "start", "--owner", owner, fast ? "--fast" : NULL, out,
                            sizeof out);
  char *nl = strchr(out, '\n');
  if (nl) *nl = '\0';
  if (st != 0 || strncmp(out, "postgres://", 11) != 0 || strlen(out) >= urlcap) {
    fprintf(stderr, "%s: %s start failed (status %d); see its message above\n", cmd, script, st);
    return -1;
  }
  memcpy(url, out, strlen(out) + 1);
  return 0;
}

void pgtmp_stop(const char *cmd, const char *script, char *dir) {
  if (!dir[0]) return;
  int st = pgtmp_run_script(script, dir, "stop", NULL, NULL, NULL, NULL, 0);
  if (st != 0) fprintf(stderr, "%s: %s stop ended with status %d\n", cmd, script, st);
  rmdir(dir); /* pg-tmp stop removed it, unless start never got far */
  dir[0] = '\0';
}
