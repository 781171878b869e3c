/*
 * backend: what a store backend provides to store.c. Internal to src/store;
 * callers use store.h only.
 *
 * Every store_t begins with a `struct store_s` whose `ops` points at its
 * backend's table; a backend embeds it as the first member of its own
 * struct and gets back with container_of. store.c's store_* functions check
 * their arguments (ids, NULLs, option ranges), reset the out-parameters,
 * normalize what store.h allows loosely (replay limit clamped to
 * 1..STORE_REPLAY_PAGE_MAX, upto < 0 -> INT64_MAX, busy timeout 0 -> 5000)
 * and only then call the backend. So an op may assume:
 *  - `s` is its own store, non-NULL;
 *  - ids satisfy util_id_valid, names fit STORE_NAME_MAX, strings are
 *    non-NULL, out-pointers documented as required are non-NULL and zeroed;
 *  - `opt` of open is non-NULL and valid.
 * Ops return what store.h documents for the corresponding store_* function;
 * each honours s->deadline_ms as store_set_deadline describes.
 */
#ifndef CONVERGER_STORE_BACKEND_H
#define CONVERGER_STORE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "store/store.h"

typedef struct store_ops_s store_ops_t;

struct store_s {
  const store_ops_t *ops;
  /* store_set_deadline: the deadline (monotonic ms, 0 none), set by
   * store.c; the backend sets deadline_hit when a call stops at it. */
  uint64_t deadline_ms;
  int deadline_hit;
};

struct store_ops_s {
  const char *name; /* "sqlite", "postgres" */
  /* `url` is the whole URL as given to store_open. */
  int (*open)(const char *url, const store_options_t *opt, store_t **out);
  void (*close)(store_t *s);
  int (*migrate)(store_t *s);
  int (*schema_version)(store_t *s);
  int (*read_begin)(store_t *s);
  void (*read_end)(store_t *s);
  int (*ping)(store_t *s);
  /* Optional (NULL: nothing to do): called by store_set_deadline after it
   * has set s->deadline_ms, for a backend that arms something for it. */
  void (*set_deadline)(store_t *s, uint64_t deadline_ms);
  int (*channel_create)(store_t *s, const char *id, const char *name, unsigned flags,
                        store_channel_t *out);
  int (*channel_get)(store_t *s, const char *id, store_channel_t *out);
  int (*channel_set_active)(store_t *s, const char *id, int active, store_channel_t *out);
  int (*conv_create)(store_t *s, const char *id, const char *channel, store_conv_t *out);
  int (*conv_get)(store_t *s, const char *id, store_conv_t *out);
  /* `out` and `created` non-NULL, zeroed. */
  int (*append)(store_t *s, const char *conv, const char *id, const char *sender, const char *body,
                int64_t ts_ms, store_msg_t *out, int *created);
  /* Optional (NULL: store.c runs `append` once per item). Items checked
   * (ids valid, strings non-NULL), their results zeroed; n >= 1. Returns
   * as store_append_batch. */
  int (*append_batch)(store_t *s, store_append_t *const *items, size_t n);
  /* `limit` in 1..STORE_REPLAY_PAGE_MAX, `upto` >= 0; *msgs NULL, *n 0. */
  int (*replay)(store_t *s, const char *conv, int64_t after, int64_t upto, int limit,
                size_t max_bytes, store_msg_t **msgs, size_t *n);
  /* `conv` NULL (every conversation) or valid; `count` non-NULL. */
  int (*epoch_rotate)(store_t *s, const char *conv, int64_t *count);
  int (*revoke)(store_t *s, const char *jti, int64_t exp_s);
  /* *jtis NULL, *n 0. */
  int (*revocations)(store_t *s, int64_t now_s, char ***jtis, size_t *n);
  /* Lengths and `state` checked; `since_ms` = now_ms - max_age_ms. */
  int (*node_beat)(store_t *s, const char *id, const char *public_url, const char *admin_url,
                   const char *state, int64_t connections, int64_t waiters, int64_t capacity,
                   int64_t now_ms);
  /* *out NULL, *n 0. */
  int (*nodes_live)(store_t *s, int64_t since_ms, store_node_t **out, size_t *n);
  /* Optional (NULL: no other node listens): send `payload` to every node. */
  int (*announce)(store_t *s, const char *payload);
  /* Optional (NULL: the backend keeps no presence; store_presence_*
   * return -CV_EINVAL). Arguments checked; outputs non-NULL, zeroed. */
  int (*presence_join)(store_t *s, const char *conv, const char *client, const char *user,
                       const char *node, int64_t since_ms, int *joined, int *first);
  int (*presence_leave)(store_t *s, const char *conv, const char *client, const char *user,
                        const char *node, int *left, int *last);
  int (*presence_list)(store_t *s, const char *conv, const char *after, int limit,
                       store_member_t **out, size_t *n, int64_t *count);
  int (*presence_sweep)(store_t *s, int64_t since_ms, int64_t *removed);
  /* Optional, as presence_sweep: `nodes` valid ids, n >= 1. */
  int (*presence_sweep_nodes)(store_t *s, char *const *nodes, size_t n, int64_t *removed);
  /* Optional (NULL: -CV_EINVAL): *ids NULL, *n 0. */
  int (*nodes_gone)(store_t *s, int64_t since_ms, char ***ids, size_t *n);
  /* Optional (NULL: -CV_EINVAL): `out` zeroed; urls checked, n >= 1. */
  int (*shardmap_get)(store_t *s, store_shardmap_t *out);
  int (*shardmap_init)(store_t *s, const char *const *urls, int n);
  /* Optional (NULL: -CV_EINVAL): `node` valid, *current zeroed. */
  int (*shardmap_sync)(store_t *s, const char *node, int64_t used, int64_t *current);
  int (*presence_of_node)(store_t *s, const char *node, char ***convs, char ***clients,
                          char ***users, size_t *n);
};

extern const store_ops_t store_sqlite_ops;
extern const store_ops_t store_postgres_ops;
extern const store_ops_t store_sharded_ops; /* sharded.c: routes to instances */

/* Copy `src` into `dst` (`cap` bytes), truncated and NUL-terminated: the
 * backends' row copies into fixed fields. */
void store_copy_str(char *dst, size_t cap, const char *src);

/* store_append_batch one item at a time, each in its own transaction with
 * the backend's `append`: what a backend falls back to when its group
 * failed as a whole (rolled back). Clears each item's results first. Stops
 * at the deadline (the rest get -CV_ETIMEDOUT too, and so does the return);
 * else 0. Thread: the store's owner. */
int store_append_each(store_t *s, store_append_t *const *items, size_t n);

#endif
