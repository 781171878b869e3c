/*
 * proccpu.c: CPU time of process trees and of the machine (bench/proccpu.h).
 */
#include "bench/proccpu.h"

#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/run.h"

/* ppid, utime + stime and cutime + cstime of /proc/PID/stat; 0 or -1. */
static int stat_read(const char *pid, long long *ppid, long long *own, long long *reaped) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%s/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
  long long pp, ut, st, cut, cst;
  /* after the name: state ppid pgrp session tty tpgid flags minflt cminflt
   * majflt cmajflt utime stime cutime cstime (proc(5)) */
  if (!p || sscanf(p + 1, " %*c %lld %*s %*s %*s %*s %*s %*s %*s %*s %*s %lld %lld %lld %lld", &pp,
                   &ut, &st, &cut, &cst) != 5)
    return -1;
  *ppid = pp;
  *own = ut + st;
  *reaped = cut + cst;
  return 0;
}

static void machine_read(long long *busy, long long *total) {
  *busy = *total = -1;
  FILE *f = fopen("/proc/stat", "re");
  if (!f) return;
  unsigned long long v[8] = {0};
  if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
             &v[5], &v[6], &v[7]) == 8) {
    /* user nice system idle iowait irq softirq steal */
    *busy = (long long)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);
    *total = *busy + (long long)(v[3] + v[4]);
  }
  fclose(f);
}

void proccpu_snap(const pid_t *roots, const int *tree, int n, proccpu_snap_t *s) {
  memset(s, 0, sizeof *s);
  if (n > PROCCPU_TREES_MAX) n = PROCCPU_TREES_MAX;
  for (int i = 0; i < PROCCPU_TREES_MAX; i++) s->ticks[i] = -1;
  for (int i = 0; i < n; i++) {
    char pid[24];
    long long pp, own, reaped;
    if (roots[i] <= 0) continue;
    snprintf(pid, sizeof pid, "%d", (int)roots[i]);
    if (stat_read(pid, &pp, &own, &reaped) == 0) s->ticks[i] = own + (tree[i] ? reaped : 0);
  }
  DIR *d = opendir("/proc");
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) {
    if (!isdigit((unsigned char)e->d_name[0])) continue;
    long long pp, own, reaped;
    if (stat_read(e->d_name, &pp, &own, &reaped) != 0) continue;
    for (int i = 0; i < n; i++)
      if (tree[i] && roots[i] > 0 && pp == roots[i] && s->ticks[i] >= 0) s->ticks[i] += own;
  }
  if (d) closedir(d);
  machine_read(&s->machine_busy, &s->machine_total);
  s->ns = run_now_ns();
}

double proccpu_wall_s(const proccpu_snap_t *a, const proccpu_snap_t *z) {
  return z->ns > a->ns ? (double)(z->ns - a->ns) / 1e9 : 0;
}

double proccpu_cores(const proccpu_snap_t *a, const proccpu_snap_t *z, int i) {
  double wall = proccpu_wall_s(a, z);
  if (i < 0 || i >= PROCCPU_TREES_MAX || a->ticks[i] < 0 || z->ticks[i] < 0 || wall <= 0) return -1;
  return (double)(z->ticks[i] - a->ticks[i]) / (double)sysconf(_SC_CLK_TCK) / wall;
}

double proccpu_machine_cores(const proccpu_snap_t *a, const proccpu_snap_t *z) {
  double wall = proccpu_wall_s(a, z);
  if (a->machine_busy < 0 || z->machine_busy < 0 || wall <= 0) return -1;
  return (double)(z->machine_busy - a->machine_busy) / (double)sysconf(_SC_CLK_TCK) / wall;
}

pid_t proccpu_pid_file(const char *path) {
  FILE *f = fopen(path, "re");
  if (!f) return -1;
  long v = -1;
  if (fscanf(f, "%ld", &v) != 1) v = -1;
  fclose(f);
  return v > 0 ? (pid_t)v : -1;
}
