/* procstat.c: see procstat.h. */
#include "core/procstat.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* Seconds since the Unix epoch at which the system booted (btime). */
static double boot_time_s(void) {
  FILE *f = fopen("/proc/stat", "r");
  if (!f) return 0;
  char line[256];
  double bt = 0;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "btime ", 6) == 0) {
      bt = (double)strtoll(line + 6, NULL, 10);
      break;
    }
  fclose(f);
  return bt;
}

/* Field 22 of /proc/self/stat: the start time in clock ticks after boot.
 * The command (field 2) may hold spaces and parentheses: skip to its last
 * ')'. */
static double start_ticks(void) {
  FILE *f = fopen("/proc/self/stat", "r");
  if (!f) return -1;
  char buf[1024];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  if (!p) return -1;
  p += 2; /* field 3 */
  for (int field = 3; field < 22 && p; field++) {
    p = strchr(p, ' ');
    if (p) p++;
  }
  return p ? strtod(p, NULL) : -1;
}

int procstat_read(procstat_t *out) {
  memset(out, 0, sizeof *out);
  int ok = 0;
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) == 0)
    out->cpu_seconds = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
  FILE *f = fopen("/proc/self/statm", "r");
  long long size = 0, resident = 0;
  if (f && fscanf(f, "%lld %lld", &size, &resident) == 2)
    out->resident_bytes = resident * sysconf(_SC_PAGESIZE);
  else
    ok = -1;
  if (f) fclose(f);
  out->open_fds = -1;
  DIR *d = opendir("/proc/self/fd");
  if (d) {
    int64_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
      if (e->d_name[0] != '.') n++;
    closedir(d);
    out->open_fds = n - 1; /* not the directory's own descriptor */
  } else {
    ok = -1;
  }
  struct rlimit rl;
  out->max_fds = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                     ? (int64_t)rl.rlim_cur
                     : -1;
  double ticks = start_ticks(), hz = (double)sysconf(_SC_CLK_TCK);
  if (ticks >= 0 && hz > 0)
    out->start_time_s = boot_time_s() + ticks / hz;
  else
    ok = -1;
  return ok;
}
