/*
 * shards_move: `converger shards move` and `converger shards add-instance`
 * (docs/operations.md, "Moving a shard and adding an instance"): a
 * logical shard's rows moved to another instance of a sharded cluster
 * with its writes frozen only for the last part of the copy, and a new
 * instance added to the map with no shards. The design is in
 * shards_move.c's header comment.
 */
#ifndef CONVERGER_CLI_SHARDS_MOVE_H
#define CONVERGER_CLI_SHARDS_MOVE_H

#include "core/config.h"

typedef struct {
  int shard;        /* the logical shard, 0..SHARD_COUNT-1 */
  int to;           /* the instance it goes to, an index of the map */
  int keep_source;  /* 1: leave the source's copies (default: deleted once every node follows) */
  int wait_s;       /* how long to wait for every live node to follow the new map; 0: 30 */
  int lock_wait_ms; /* how long the freeze may wait for writes in flight; 0: 5000 */
} shards_move_t;

/* Move logical shard `m->shard` of the cluster whose control database is
 * cfg->database_url to instance `m->to`, printing its steps and timings
 * on stdout (errors on stderr). Exit status: 0 moved; 1 the move failed
 * (nothing changed: the shard is where it was, writable) or the nodes did
 * not all follow in time (moved; the source's copies kept); 2 usage (a
 * shard or instance out of range, the shard there already). Main thread;
 * blocks. */
int shards_move(const config_t *cfg, const shards_move_t *m);

/* Delete the copies of logical shard `shard` that instances the shard
 * moved away from kept (`move --keep-source`, or a move whose wait ran
 * out), once every live node routes by the current map (waiting at most
 * `wait_s`, 0: 30 s). Exit status: 0; 1 a database failed or a node did
 * not follow in time. Main thread. */
int shards_cleanup(const config_t *cfg, int shard, int wait_s);

/* Add PostgreSQL instance `url` to the map (migrated first), as the next
 * index, holding no logical shard; the map's version goes up, and every
 * node reads it at its next heartbeat. Exit status: 0; 1 the instance or
 * the control database failed; 2 a URL that is not PostgreSQL, one the
 * map has already, or a map full (STORE_INSTANCES_MAX). Main thread. */
int shards_add_instance(const config_t *cfg, const char *url);

#endif
