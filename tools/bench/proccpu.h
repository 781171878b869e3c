/*
 * proccpu: CPU time of process trees and of the whole machine, read from
 * /proc, for a bench that has to say where the cores went during a phase
 * (`converger bench store`: the PostgreSQL servers against the node, the
 * bench and the rest of the machine).
 *
 * Units: clock ticks (sysconf(_SC_CLK_TCK), 100 a second on Linux), user +
 * system. A tree is a root pid and its direct children (a postmaster and
 * its backends, checkpointer, WAL writer...): the root's own ticks, plus
 * its cutime/cstime (children it has reaped, so that a backend that exits
 * between two readings keeps its share), plus each living child's.
 *
 * Main thread only; blocking reads of /proc. Nothing is allocated.
 */
#ifndef CONVERGER_TOOLS_BENCH_PROCCPU_H
#define CONVERGER_TOOLS_BENCH_PROCCPU_H

#include <sys/types.h>

#define PROCCPU_TREES_MAX 16

/* One reading: ticks[i] of the tree of roots[i] (-1 when its root is
 * unreadable), the machine's busy and total ticks summed over every CPU
 * (/proc/stat's first line: busy = user + nice + system + irq + softirq +
 * steal; total adds idle and iowait), and the monotonic time. */
typedef struct {
  long long ticks[PROCCPU_TREES_MAX];
  long long machine_busy, machine_total;
  unsigned long long ns;
} proccpu_snap_t;

/* Read `roots` (n of them, at most PROCCPU_TREES_MAX; a root of 0 or less
 * reads as -1) and the machine into `s`: root i with its children when
 * tree[i] is 1, its own ticks alone when 0 (a process whose children are
 * measured apart, such as the bench and its nodes). Never fails: what
 * cannot be read is -1. */
void proccpu_snap(const pid_t *roots, const int *tree, int n, proccpu_snap_t *s);

/* Tree i's CPU use from a to z, in cores (CPU seconds per wall second);
 * -1 when either reading lacks it or no time passed. */
double proccpu_cores(const proccpu_snap_t *a, const proccpu_snap_t *z, int i);

/* The machine's busy cores from a to z (all processes, this bench's
 * neighbours included); -1 when unreadable. */
double proccpu_machine_cores(const proccpu_snap_t *a, const proccpu_snap_t *z);

/* Seconds of wall time from a to z. */
double proccpu_wall_s(const proccpu_snap_t *a, const proccpu_snap_t *z);

/* The first pid of `path` (a postmaster.pid file), or -1. */
pid_t proccpu_pid_file(const char *path);

#endif
