/*
 * fleet: the nodes a rolling restart works on, as their admin API shows
 * them: found from one node's GET /admin/cluster or from a list of URLs,
 * sampled through GET /admin/status, told through POST /admin/drain and
 * /admin/shed, checked through GET /readyz (docs/protocol.md, "Admin
 * API"). Blocking HTTP (net/httpc.h), one short request per call.
 *
 * Main thread only (the command-line tools).
 */
#ifndef CONVERGER_CLI_FLEET_H
#define CONVERGER_CLI_FLEET_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "net/httpc.h"

#define FLEET_ID_MAX 128

/* One node and its last sample. */
typedef struct {
  char id[FLEET_ID_MAX + 1];
  httpc_url_t url; /* its admin API: http://host:port[/prefix] */
  char shown[HTTPC_HOST_MAX + 32];
  /* the last GET /admin/status */
  int up;         /* it answered, or its last answer stands (see missed) */
  int missed;     /* samples in a row without an answer (timeouts); up drops at FLEET_MISSES */
  int ready;      /* /readyz would answer 200 */
  char state[16]; /* starting, ready, draining, stopping */
  int64_t connections, capacity;
  double cpu;                         /* loop utilisation 0..1; -1: not known */
  int told, moved, closed, remaining; /* its drain's or shed's progress */
  int drain_window_ms, drain_shutdown_ms;
  double started_at; /* the process's start (s since the epoch): a restart changes it */
} fleet_node_t;

typedef struct {
  fleet_node_t *v;
  size_t n;
  const char *api_key;                /* borrowed */
  int timeout_ms;                     /* each request's deadline */
  volatile sig_atomic_t *interrupted; /* the caller's SIGINT flag, or NULL */
} fleet_t;

/* The live nodes of the cluster that `url` (the admin URL, http://host:port,
 * of any node) belongs to, from its GET /admin/cluster: each node's admin
 * URL is its adminUrl (its admin listener), or else its publicUrl's host
 * and port over http. Returns 0, or -1 with a one-line reason in err[len]. */
int fleet_from_cluster(fleet_t *f, const char *url, char *err, size_t len);

/* The nodes at `csv` ("http://a:9090,http://b:9090"), their ids read from
 * their GET /admin/status. Returns 0, or -1 with a reason. */
int fleet_from_urls(fleet_t *f, const char *csv, char *err, size_t len);

/* GET /admin/status of node i into its sample. A node that refuses the
 * connection (nothing listens: it exited) is down at once; one that does
 * not answer in time (a busy node) keeps its last figures for
 * FLEET_MISSES - 1 samples, so that a slow answer is not counted as lost
 * connections. */
#define FLEET_MISSES 3
void fleet_sample_node(fleet_t *f, size_t i);

/* GET /readyz of node i: 1 when it answers 200, else 0. */
int fleet_readyz(fleet_t *f, size_t i);

/* POST `path` with the JSON `body` (NULL: none) to node i. Returns the
 * HTTP status, or a negative errno with a reason in err[len]. */
int fleet_post(fleet_t *f, size_t i, const char *path, const char *body, char *err, size_t len);

/* Free the nodes. */
void fleet_free(fleet_t *f);

#endif
