/*
 * gnuplot: see gnuplot.h.
 */
#include "plot/gnuplot.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Exit status of the child when exec fails: the shell's "command not found". */
#define EXEC_FAILED 127

static int write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

int gnuplot_run(const char *dir, const char *script, char *err, size_t errlen) {
  int in[2], errp[2];
  if (errlen) err[0] = '\0';
  if (pipe2(in, O_CLOEXEC) != 0) {
    snprintf(err, errlen, "gnuplot: pipe: %s", strerror(errno));
    return -1;
  }
  if (pipe2(errp, O_CLOEXEC) != 0) {
    snprintf(err, errlen, "gnuplot: pipe: %s", strerror(errno));
    close(in[0]);
    close(in[1]);
    return -1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(err, errlen, "gnuplot: fork: %s", strerror(errno));
    close(in[0]);
    close(in[1]);
    close(errp[0]);
    close(errp[1]);
    return -1;
  }
  if (pid == 0) {
    dup2(in[0], STDIN_FILENO);
    dup2(errp[1], STDERR_FILENO);
    int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (devnull >= 0) dup2(devnull, STDOUT_FILENO);
    if (dir && chdir(dir) != 0) _exit(EXEC_FAILED - 1);
    execlp("gnuplot", "gnuplot", (char *)NULL);
    _exit(EXEC_FAILED);
  }
  close(in[0]);
  close(errp[1]);
  /* A script larger than the pipe buffer would block here while gnuplot
   * blocks on a full stderr pipe only if gnuplot wrote more than 64 KiB of
   * errors before reading its input; it reads as it goes, so it does not. */
  void (*old)(int) = signal(SIGPIPE, SIG_IGN);
  int wr = write_all(in[1], script, strlen(script));
  close(in[1]);
  signal(SIGPIPE, old);
  char buf[1024]; /* the tail of gnuplot's stderr: its error is at the end */
  size_t n = 0;
  for (;;) {
    if (n == sizeof buf - 1) { /* full: keep the second half */
      memmove(buf, buf + n / 2, n - n / 2);
      n -= n / 2;
    }
    ssize_t r = read(errp[0], buf + n, sizeof buf - 1 - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += (size_t)r;
  }
  buf[n] = '\0';
  close(errp[0]);
  int st;
  while (waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR) {
      snprintf(err, errlen, "gnuplot: waitpid: %s", strerror(errno));
      return -1;
    }
  }
  /* the last non-empty line: gnuplot's warnings come before its error */
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) buf[--n] = '\0';
  char *last = strrchr(buf, '\n');
  last = last ? last + 1 : buf;
  while (*last == ' ') last++;
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
  if (WIFEXITED(st) && WEXITSTATUS(st) == EXEC_FAILED)
    snprintf(err, errlen, "gnuplot not found (run scripts/setup: package gnuplot-nox)");
  else if (WIFEXITED(st) && WEXITSTATUS(st) == EXEC_FAILED - 1)
    snprintf(err, errlen, "gnuplot: cannot enter %s", dir);
  else if (WIFSIGNALED(st))
    snprintf(err, errlen, "gnuplot killed by signal %d", WTERMSIG(st));
  else
    snprintf(err, errlen, "gnuplot exited %d: %s", WEXITSTATUS(st),
             last[0] ? last : "(no message)");
  (void)wr; /* a failed write shows as gnuplot's own error or exit status */
  return -1;
}

int gnuplot_appendf(char *buf, size_t len, const char *fmt, ...) {
  size_t used = strlen(buf);
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + used, len - used, fmt, ap);
  va_end(ap);
  return n < 0 || (size_t)n >= len - used ? -1 : 0;
}

int gnuplot_append_path(char *buf, size_t len, const char *dir, const char *file) {
  if (gnuplot_appendf(buf, len, "'") != 0) return -1;
  for (int part = 0; part < 2; part++) {
    const char *p = part ? file : dir;
    if (part && gnuplot_appendf(buf, len, "/") != 0) return -1;
    for (; *p; p++)
      if (gnuplot_appendf(buf, len, *p == '\'' ? "''" : "%c", *p) != 0) return -1;
  }
  return gnuplot_appendf(buf, len, "'");
}
