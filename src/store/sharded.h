/*
 * sharded: one node's view of a sharded cluster's store (docs/operations.md,
 * "Scaling out").
 *
 * The node's store URL names the control database: the shard map
 * (store_shardmap_t, written by `converger shards init`), channels,
 * membership and revocations live there. Each conversation's rows (the
 * conversation, its messages and its presence) live on the PostgreSQL
 * instance its logical shard (core/shard.h) is mapped to, with a copy of
 * its channel's row. A store_t opened with store_options_t.shards set is
 * a router (sharded.c) that holds one connection to the control database
 * and, opened when first needed, one to each instance, and sends every
 * call where its rows are: what store.h promises for one database holds
 * per conversation, because a conversation's row lock and its idempotency
 * key live on its one instance.
 *
 * A store_shards_t is what the routers of one node share: the map (read
 * by the first router opened) and each instance's health. An instance
 * that fails (a connection refused or broken, a statement not answered
 * within its deadline after at least STORE_SHARD_SLOW_MS) is "down" for STORE_SHARD_DOWN_MS: its calls fail at once with
 * -CV_ESHARD, except one probe at a time, whose success ends it. At most
 * `inflight_max` calls are inside one instance at once (more fail at once
 * with -CV_ESHARD), so an instance that hangs holds that many of the
 * pool's workers, never all of them: the other shards' conversations keep
 * their workers (the blast radius of one shard).
 */
#ifndef CONVERGER_STORE_SHARDED_H
#define CONVERGER_STORE_SHARDED_H

#include <stdint.h>

#include "core/metrics.h"
#include "store/store.h"

#define STORE_SHARD_DOWN_MS 1000 /* an instance that failed: calls fail at once this long */
#define STORE_SHARD_SLOW_MS 1000 /* a call that reached its deadline after this long: failed */

/* New shared state for the routers of one node, recording per-instance
 * call latency (converger_shard_store_ms{db_instance}) in `metrics`
 * (borrowed, may be NULL; any thread). `inflight_max` >= 1: calls inside
 * one instance at once. NULL when out of memory. Free with
 * store_shards_free once every router is closed. Any thread. */
store_shards_t *store_shards_new(int inflight_max, metrics_t *metrics);
void store_shards_free(store_shards_t *sh);

/* One instance's figures since the start, for metrics and /admin/status. */
typedef struct {
  int up;          /* 1 unless it failed within STORE_SHARD_DOWN_MS and no call succeeded since */
  uint64_t calls;  /* calls made */
  uint64_t errors; /* calls that failed for the instance (-CV_ESHARD) */
  int inflight;    /* calls inside it now */
} store_shard_stats_t;

/* The number of instances of the map the routers read (0 before the first
 * router opened), and instance `i`'s figures and redacted URL (`url`,
 * `cap` bytes; may be NULL). Any thread. */
int store_shards_count(store_shards_t *sh);
void store_shards_stats(store_shards_t *sh, int i, store_shard_stats_t *out, char *url, size_t cap);

/* Copy every instance's figures into the registry given to
 * store_shards_new (nothing when it was NULL, or before the map is read):
 * converger_shard_up{db_instance} set from `up`, and
 * converger_shard_errors_total{db_instance} raised by the errors since the
 * last call (its series exists from the first call, at 0). The node calls
 * it once a second (serve.c). Loop thread (the registry's counters and
 * gauges are the loop's), one caller. */
void store_shards_export(store_shards_t *sh);

/* 1 when an instance is down and its pause is over: a probe is due
 * (store_shards_probe). Any thread. */
int store_shards_probe_due(store_shards_t *sh);

/* On a worker whose store `router` is a router of this cluster: one call
 * (a ping) to each instance that is down and whose pause is over, so that
 * an instance no conversation's call reaches is seen back
 * (converger_shard_up); the caller's store deadline bounds a hung one. -CV_EINVAL for a store that is not a router. */
int store_shards_probe(store_t *router);

/* The instance holding conversation `conv`'s rows (0..count-1), or -1
 * before the map is read. Any thread. */
int store_shards_instance_of(store_shards_t *sh, const char *conv);

#endif
