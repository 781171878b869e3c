/*
 * shard: where a conversation lives in a sharded cluster (docs/operations.md,
 * "Scaling out"). Two stable hashes of the conversation id, documented in
 * docs/operations.md so that any tool can compute them:
 *
 *   key(conv)       = FNV-1a 64 of the id's bytes (offset basis
 *                     14695981039346656037, prime 1099511628211)
 *   shard(conv)     = key(conv) mod SHARD_COUNT: its logical shard, which
 *                     the shard map in the control database places on a
 *                     PostgreSQL instance (store.h, store_shardmap_t); the
 *                     count is fixed, so moving a shard moves only its own
 *                     conversations;
 *   bus(conv, B)    = jump(key(conv), B): the Redis instance of its bus
 *                     channel among B, Lamping and Veach's jump consistent
 *                     hash ("A Fast, Minimal Memory, Consistent Hash
 *                     Algorithm", 2014): going from B to B + 1 instances
 *                     moves 1 / (B + 1) of the conversations.
 *
 * Pure functions, any thread.
 */
#ifndef CONVERGER_CORE_SHARD_H
#define CONVERGER_CORE_SHARD_H

#include <stdint.h>

#define SHARD_COUNT 256 /* logical shards: fixed for the life of a cluster */

/* FNV-1a 64 of the NUL-terminated `s`. */
uint64_t shard_key(const char *s);

/* The logical shard of conversation `conv`, 0..SHARD_COUNT-1. */
int shard_of(const char *conv);

/* Jump consistent hash of `key` into 0..buckets-1 (buckets >= 1; 0 for
 * buckets < 1). */
int shard_jump(uint64_t key, int buckets);

#endif
