/*
 * procstat: this process's resource figures, read from Linux's /proc and
 * getrusage/getrlimit, for the process_* metrics of the Prometheus client
 * conventions (prometheus.io, "Writing client libraries": process metrics)
 * and for the event loop's utilisation.
 *
 * Any thread; no state.
 */
#ifndef CONVERGER_CORE_PROCSTAT_H
#define CONVERGER_CORE_PROCSTAT_H

#include <stdint.h>

typedef struct {
  double cpu_seconds;     /* user + system CPU time of every thread */
  int64_t resident_bytes; /* resident set size */
  int64_t open_fds;       /* entries of /proc/self/fd; -1: unreadable */
  int64_t max_fds;        /* RLIMIT_NOFILE's soft limit; -1: unlimited */
  double start_time_s;    /* process start, seconds since the Unix epoch */
} procstat_t;

/* Fill `out` with the figures now. Returns 0, or -1 when /proc could not
 * be read (the fields that could be read are filled, the others are 0). */
int procstat_read(procstat_t *out);

#endif
