/*
 * phase: the words of a node's lifecycle, below everything that reports
 * them (/readyz, /admin/status, the membership row). The lifecycle itself,
 * the one place that moves a node from phase to phase, is lifecycle.c.
 */
#ifndef CONVERGER_CORE_PHASE_H
#define CONVERGER_CORE_PHASE_H

/* The lifecycle's phases (lifecycle.h); they only move forward. */
typedef enum {
  NODE_STARTING = 0, /* listening soon, not ready: /readyz 503 "starting" */
  NODE_READY,        /* /readyz 200 (with the store up), upgrades accepted */
  NODE_DRAINING,     /* a drain began: not ready, upgrades refused, REST served */
  NODE_STOPPING,     /* closing everything and exiting */
  NODE_STOPPED,      /* the pool is joined; the loop is ending */
} node_phase_t;

/* The word for `p` in /readyz, /admin/status and logs: "starting",
 * "ready", "draining", "stopping", "stopped". */
static inline const char *node_phase_name(node_phase_t p) {
  static const char *const names[] = {"starting", "ready", "draining", "stopping", "stopped"};
  return (unsigned)p < sizeof names / sizeof names[0] ? names[p] : "unknown";
}

#endif
