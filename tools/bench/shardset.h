/*
 * shardset: a throwaway sharded cluster's servers for a bench run
 * (docs/operations.md, "Scaling out"): N PostgreSQL instances, each its own
 * cluster of scripts/pg-tmp (bench/pgtmp.h), every one migrated and the
 * shard map written over them into instance 0, which also holds the control
 * database (as `converger shards init` does), and B redis-servers as the
 * bus, on free loopback ports without persistence (--save '' --appendonly
 * no). A node of that cluster gets CONVERGER_DATABASE_URL = url[0] and
 * CONVERGER_BUS = bus. Used by `converger bench store --shards` and
 * `bench roll --shards`.
 *
 * What it owns: the PostgreSQL clusters (stopped by scripts/pg-tmp by pid,
 * their directories removed) and the redis-servers (stopped by their pids;
 * each runs in its own process group and gets SIGKILL if the bench dies).
 *
 * Main thread, no loop running (the calls block).
 */
#ifndef CONVERGER_TOOLS_BENCH_SHARDSET_H
#define CONVERGER_TOOLS_BENCH_SHARDSET_H

#include <stdint.h>
#include <sys/types.h>

#include "core/shard.h"
#include "store/store.h"

#define SHARDSET_MAX_INSTANCES 8
#define SHARDSET_MAX_BUS       4

typedef struct {
  int ninst, nbus;
  char dir[SHARDSET_MAX_INSTANCES][128]; /* PG_TMP_DIR of each; "" when none */
  char url[SHARDSET_MAX_INSTANCES][STORE_URL_MAX];
  uint8_t map[SHARD_COUNT];          /* logical shard -> instance, as read back */
  pid_t redis_pid[SHARDSET_MAX_BUS]; /* 0 when not running */
  int redis_port[SHARDSET_MAX_BUS];
  char bus[SHARDSET_MAX_BUS * 32]; /* "redis://127.0.0.1:P0,redis://127.0.0.1:P1" */
} shardset_t;

/* Start `ninst` (1..SHARDSET_MAX_INSTANCES) PostgreSQL instances with the
 * script `pg_tmp` and `nbus` (1..SHARDSET_MAX_BUS) redis-servers (from
 * PATH), write the shard map and read it back into s->map. `fast` 1: each
 * instance `pg-tmp start --fast` (fsync, synchronous_commit and
 * full_page_writes off, NOT durable: for a bench that never restarts the
 * database); 0: durable. `s` must be zeroed first. `cmd` prefixes the
 * messages printed to stderr. Returns 0, or -1 after printing why; call
 * shardset_stop either way. */
int shardset_start(shardset_t *s, const char *cmd, const char *pg_tmp, int ninst, int nbus,
                   int fast);

/* Stop the redis-servers by pid and the instances by scripts/pg-tmp
 * (`pg_tmp`), whatever shardset_start got to. Never fails (prints to
 * stderr when a stop does). */
void shardset_stop(shardset_t *s, const char *cmd, const char *pg_tmp);

/* The instance of conversation `conv` by s->map. */
int shardset_instance_of(const shardset_t *s, const char *conv);

#endif
