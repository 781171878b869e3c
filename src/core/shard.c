/*
 * shard.c: the two hashes of shard.h.
 */
#include "core/shard.h"

uint64_t shard_key(const char *s) {
  uint64_t h = 14695981039346656037ull;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    h ^= *p;
    h *= 1099511628211ull;
  }
  return h;
}

int shard_of(const char *conv) { return (int)(shard_key(conv) % SHARD_COUNT); }

/* Lamping and Veach 2014, figure 1, as published. */
int shard_jump(uint64_t key, int buckets) {
  if (buckets < 1) return 0;
  int64_t b = -1, j = 0;
  while (j < buckets) {
    b = j;
    key = key * 2862933555777941757ull + 1;
    j = (int64_t)((double)(b + 1) * ((double)(1ll << 31) / (double)((key >> 33) + 1)));
  }
  return (int)b;
}
