/*
 * store.c: the store_* functions of store.h, dispatching to a backend.
 *
 * store_open reads the URL's form (dburl_backend, core/dburl.h) and calls that
 * backend's open; the store it returns carries its ops table (backend.h),
 * and every other store_* function checks its arguments here, once for all
 * backends, then calls through the table. Nothing here touches a database;
 * the frees of returned messages and strings live here too because they do
 * not depend on the backend.
 *
 * Thread: whichever thread owns the store (store.h); no state of its own.
 */
#include "store/store.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "common/util.h"
#include "core/config.h"
#include "core/dburl.h"
#include "store/backend.h"

#define BUSY_TIMEOUT_DEFAULT_MS 5000

_Static_assert(STORE_URL_MAX == CONFIG_URL_MAX,
               "a public URL the config accepts fits the membership row");

/* ---- dispatch ---------------------------------------------------------- */

int store_open(const char *url, const store_options_t *opt, store_t **out) {
  if (out != NULL) *out = NULL;
  const char *name = dburl_backend(url);
  if (name == NULL || out == NULL) return -CV_EINVAL;
  store_options_t o = {.sync = STORE_SYNC_FULL, .busy_timeout_ms = 0};
  if (opt != NULL) o = *opt;
  if ((int)o.sync < STORE_SYNC_OFF || (int)o.sync > STORE_SYNC_FULL || o.busy_timeout_ms < 0)
    return -CV_EINVAL;
  if (o.busy_timeout_ms == 0) o.busy_timeout_ms = BUSY_TIMEOUT_DEFAULT_MS;
  const store_ops_t *ops = strcmp(name, "sqlite") == 0 ? &store_sqlite_ops : &store_postgres_ops;
  if (o.shards != NULL) { /* a sharded cluster: the URL is its control database's */
    if (ops != &store_postgres_ops) return -CV_EINVAL;
    ops = &store_sharded_ops;
  }
  return ops->open(url, &o, out);
}

void store_close(store_t *s) {
  if (s != NULL) s->ops->close(s);
}

int store_migrate(store_t *s) { return s != NULL ? s->ops->migrate(s) : -CV_EINVAL; }

int store_schema_version(store_t *s) { return s != NULL ? s->ops->schema_version(s) : -CV_EINVAL; }

int store_read_begin(store_t *s) { return s != NULL ? s->ops->read_begin(s) : -CV_EINVAL; }

void store_read_end(store_t *s) {
  if (s != NULL) s->ops->read_end(s);
}

int store_ping(store_t *s) { return s != NULL ? s->ops->ping(s) : -CV_EINVAL; }

void store_set_deadline(store_t *s, uint64_t deadline_ms) {
  if (s == NULL) return;
  s->deadline_ms = deadline_ms;
  s->deadline_hit = 0;
  if (s->ops->set_deadline != NULL) s->ops->set_deadline(s, deadline_ms);
}

int store_deadline_hit(const store_t *s) { return s != NULL && s->deadline_hit; }

int store_channel_create(store_t *s, const char *id, const char *name, unsigned flags,
                         store_channel_t *out) {
  if (s == NULL || !util_id_valid(id) || name == NULL ||
      strnlen(name, STORE_NAME_MAX + 1) > STORE_NAME_MAX ||
      (flags & ~(STORE_CHANNEL_PRESENCE | STORE_CHANNEL_SIGNALS)) != 0)
    return -CV_EINVAL;
  return s->ops->channel_create(s, id, name, flags, out);
}

int store_channel_get(store_t *s, const char *id, store_channel_t *out) {
  if (s == NULL || !util_id_valid(id)) return -CV_EINVAL;
  return s->ops->channel_get(s, id, out);
}

int store_channel_set_active(store_t *s, const char *id, int active, store_channel_t *out) {
  if (s == NULL || !util_id_valid(id)) return -CV_EINVAL;
  return s->ops->channel_set_active(s, id, active != 0, out);
}

int store_conv_create(store_t *s, const char *id, const char *channel, store_conv_t *out) {
  if (s == NULL || !util_id_valid(id) || !util_id_valid(channel)) return -CV_EINVAL;
  return s->ops->conv_create(s, id, channel, out);
}

int store_conv_get(store_t *s, const char *id, store_conv_t *out) {
  if (s == NULL || !util_id_valid(id)) return -CV_EINVAL;
  return s->ops->conv_get(s, id, out);
}

int store_append(store_t *s, const char *conv, const char *id, const char *sender, const char *body,
                 int64_t ts_ms, store_msg_t *out, int *created) {
  if (out != NULL) memset(out, 0, sizeof *out);
  if (created != NULL) *created = 0;
  if (s == NULL || !util_id_valid(conv) || !util_id_valid(id) || sender == NULL || body == NULL ||
      out == NULL || created == NULL)
    return -CV_EINVAL;
  return s->ops->append(s, conv, id, sender, body, ts_ms, out, created);
}

/* Each item in its own transaction: the fallback of a backend without a
 * group commit, and of a group that failed as a whole. */
int store_append_each(store_t *s, store_append_t *const *items, size_t n) {
  for (size_t i = 0; i < n; i++) {
    store_append_t *a = items[i];
    store_msg_clear(&a->msg);
    a->created = 0;
    a->status =
        s->ops->append(s, a->conv, a->id, a->sender, a->body, a->ts_ms, &a->msg, &a->created);
    /* past the deadline the rest would fail the same way, one by one */
    if (a->status == -CV_ETIMEDOUT)
      for (size_t k = i + 1; k < n; k++) items[k]->status = -CV_ETIMEDOUT;
    if (a->status == -CV_ETIMEDOUT) return -CV_ETIMEDOUT;
  }
  return 0;
}

int store_append_batch(store_t *s, store_append_t *const *items, size_t n) {
  if (s == NULL || items == NULL || n == 0 || n > STORE_BATCH_MAX) return -CV_EINVAL;
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    store_append_t *a = items[i];
    memset(&a->msg, 0, sizeof a->msg);
    a->created = 0;
    a->status = 0;
    if (!util_id_valid(a->conv) || !util_id_valid(a->id) || a->sender == NULL || a->body == NULL)
      a->status = -CV_EINVAL, bad = 1;
  }
  if (bad) {
    /* the valid ones go on their own; the invalid ones keep -CV_EINVAL */
    for (size_t i = 0; i < n; i++) {
      store_append_t *a = items[i];
      if (a->status == 0)
        a->status =
            s->ops->append(s, a->conv, a->id, a->sender, a->body, a->ts_ms, &a->msg, &a->created);
    }
    return 0;
  }
  if (s->ops->append_batch == NULL || n == 1) return store_append_each(s, items, n);
  return s->ops->append_batch(s, items, n);
}

int store_replay(store_t *s, const char *conv, int64_t after, int64_t upto, int limit,
                 size_t max_bytes, store_msg_t **msgs, size_t *n) {
  if (msgs != NULL) *msgs = NULL;
  if (n != NULL) *n = 0;
  if (s == NULL || !util_id_valid(conv) || msgs == NULL || n == NULL) return -CV_EINVAL;
  if (limit < 1) limit = 1;
  if (limit > STORE_REPLAY_PAGE_MAX) limit = STORE_REPLAY_PAGE_MAX;
  if (upto < 0) upto = INT64_MAX;
  return s->ops->replay(s, conv, after, upto, limit, max_bytes, msgs, n);
}

int store_epoch_rotate(store_t *s, const char *conv, int64_t *count) {
  int64_t n = 0;
  if (count != NULL) *count = 0;
  if (s == NULL || (conv != NULL && !util_id_valid(conv))) return -CV_EINVAL;
  int err = s->ops->epoch_rotate(s, conv, &n);
  if (!err && count != NULL) *count = n;
  return err;
}

int store_revoke(store_t *s, const char *jti, int64_t exp_s) {
  if (s == NULL || jti == NULL || jti[0] == '\0') return -CV_EINVAL;
  return s->ops->revoke(s, jti, exp_s);
}

int store_announce(store_t *s, const char *payload) {
  if (s == NULL || payload == NULL || strlen(payload) > STORE_NOTIFY_PAYLOAD_MAX) return -CV_EINVAL;
  return s->ops->announce ? s->ops->announce(s, payload) : 0;
}

int store_revocations(store_t *s, int64_t now_s, char ***jtis, size_t *n) {
  if (jtis != NULL) *jtis = NULL;
  if (n != NULL) *n = 0;
  if (s == NULL || jtis == NULL || n == NULL) return -CV_EINVAL;
  return s->ops->revocations(s, now_s, jtis, n);
}

static int node_state_valid(const char *state) {
  return state != NULL && (strcmp(state, "ready") == 0 || strcmp(state, "draining") == 0);
}

int store_node_beat(store_t *s, const char *id, const char *public_url, const char *admin_url,
                    const char *state, int64_t connections, int64_t waiters, int64_t capacity,
                    int64_t now_ms) {
  if (s == NULL || id == NULL || id[0] == '\0' || strnlen(id, STORE_ID_MAX + 1) > STORE_ID_MAX ||
      public_url == NULL || public_url[0] == '\0' ||
      strnlen(public_url, STORE_URL_MAX + 1) > STORE_URL_MAX || admin_url == NULL ||
      strnlen(admin_url, STORE_URL_MAX + 1) > STORE_URL_MAX || !node_state_valid(state) ||
      connections < 0 || waiters < 0 || capacity < 0)
    return -CV_EINVAL;
  return s->ops->node_beat(s, id, public_url, admin_url, state, connections, waiters, capacity,
                           now_ms);
}

int store_nodes_live(store_t *s, int64_t now_ms, int64_t max_age_ms, store_node_t **out,
                     size_t *n) {
  if (out != NULL) *out = NULL;
  if (n != NULL) *n = 0;
  if (s == NULL || out == NULL || n == NULL || max_age_ms < 0) return -CV_EINVAL;
  int64_t since = now_ms >= INT64_MIN + max_age_ms ? now_ms - max_age_ms : INT64_MIN;
  return s->ops->nodes_live(s, since, out, n);
}

/* ---- presence ----------------------------------------------------------- */

int store_presence_join(store_t *s, const char *conv, const char *client, const char *user,
                        const char *node, int64_t since_ms, int *joined, int *first) {
  if (joined != NULL) *joined = 0;
  if (first != NULL) *first = 0;
  if (s == NULL || !s->ops->presence_join || !util_id_valid(conv) || !util_id_valid(client) ||
      !util_id_valid(user) || !util_id_valid(node) || joined == NULL || first == NULL)
    return -CV_EINVAL;
  return s->ops->presence_join(s, conv, client, user, node, since_ms, joined, first);
}

int store_presence_leave(store_t *s, const char *conv, const char *client, const char *user,
                         const char *node, int *left, int *last) {
  if (left != NULL) *left = 0;
  if (last != NULL) *last = 0;
  if (s == NULL || !s->ops->presence_leave || !util_id_valid(conv) || !util_id_valid(client) ||
      !util_id_valid(user) || !util_id_valid(node) || left == NULL || last == NULL)
    return -CV_EINVAL;
  return s->ops->presence_leave(s, conv, client, user, node, left, last);
}

int store_presence_list(store_t *s, const char *conv, const char *after, int limit,
                        store_member_t **out, size_t *n, int64_t *count) {
  if (out != NULL) *out = NULL;
  if (n != NULL) *n = 0;
  if (count != NULL) *count = 0;
  if (s == NULL || !s->ops->presence_list || !util_id_valid(conv) || after == NULL ||
      (after[0] && !util_id_valid(after)) || limit < 0 || out == NULL || n == NULL || count == NULL)
    return -CV_EINVAL;
  return s->ops->presence_list(s, conv, after, limit, out, n, count);
}

int store_presence_sweep(store_t *s, int64_t now_ms, int64_t max_age_ms, int64_t *removed) {
  int64_t dummy;
  if (removed == NULL) removed = &dummy;
  *removed = 0;
  if (s == NULL || !s->ops->presence_sweep || max_age_ms < 0) return -CV_EINVAL;
  return s->ops->presence_sweep(s, now_ms - max_age_ms, removed);
}

int store_presence_sweep_nodes(store_t *s, char *const *nodes, size_t n, int64_t *removed) {
  int64_t dummy;
  if (removed == NULL) removed = &dummy;
  *removed = 0;
  if (s == NULL || !s->ops->presence_sweep_nodes || (n > 0 && nodes == NULL)) return -CV_EINVAL;
  for (size_t i = 0; i < n; i++)
    if (!util_id_valid(nodes[i])) return -CV_EINVAL;
  return n == 0 ? 0 : s->ops->presence_sweep_nodes(s, nodes, n, removed);
}

int store_nodes_gone(store_t *s, int64_t now_ms, int64_t max_age_ms, char ***ids, size_t *n) {
  if (ids != NULL) *ids = NULL;
  if (n != NULL) *n = 0;
  if (s == NULL || !s->ops->nodes_gone || max_age_ms < 0 || ids == NULL || n == NULL)
    return -CV_EINVAL;
  return s->ops->nodes_gone(s, now_ms - max_age_ms, ids, n);
}

int store_shardmap_get(store_t *s, store_shardmap_t *out) {
  if (out != NULL) memset(out, 0, sizeof *out);
  if (s == NULL || out == NULL || !s->ops->shardmap_get) return -CV_EINVAL;
  return s->ops->shardmap_get(s, out);
}

int store_shardmap_init(store_t *s, const char *const *urls, int n) {
  if (s == NULL || urls == NULL || n < 1 || n > STORE_INSTANCES_MAX || !s->ops->shardmap_init)
    return -CV_EINVAL;
  for (int i = 0; i < n; i++)
    if (urls[i] == NULL || !urls[i][0] || strlen(urls[i]) > STORE_URL_MAX ||
        dburl_backend(urls[i]) == NULL || strcmp(dburl_backend(urls[i]), "postgres") != 0)
      return -CV_EINVAL;
  return s->ops->shardmap_init(s, urls, n);
}

int store_shardmap_sync(store_t *s, const char *node, int64_t used, int64_t *current) {
  if (current != NULL) *current = 0;
  if (s == NULL || node == NULL || !node[0] || strlen(node) > STORE_ID_MAX || current == NULL ||
      used < 0 || !s->ops->shardmap_sync)
    return -CV_EINVAL;
  return s->ops->shardmap_sync(s, node, used, current);
}

void store_shardmap_clear(store_shardmap_t *m) {
  if (m == NULL) return;
  for (int i = 0; i < m->n && i < STORE_INSTANCES_MAX; i++) free(m->urls[i]);
  memset(m, 0, sizeof *m);
}

int store_presence_of_node(store_t *s, const char *node, char ***convs, char ***clients,
                           char ***users, size_t *n) {
  if (convs != NULL) *convs = NULL;
  if (clients != NULL) *clients = NULL;
  if (users != NULL) *users = NULL;
  if (n != NULL) *n = 0;
  if (s == NULL || !s->ops->presence_of_node || !util_id_valid(node) || convs == NULL ||
      clients == NULL || users == NULL || n == NULL)
    return -CV_EINVAL;
  return s->ops->presence_of_node(s, node, convs, clients, users, n);
}

/* ---- results ------------------------------------------------------------ */

void store_msg_clear(store_msg_t *m) {
  if (m == NULL) return;
  free(m->sender);
  free(m->body);
  memset(m, 0, sizeof *m);
}

void store_msgs_free(store_msg_t *msgs, size_t n) {
  if (msgs == NULL) return;
  for (size_t i = 0; i < n; i++) store_msg_clear(&msgs[i]);
  free(msgs);
}

void store_strings_free(char **v, size_t n) {
  if (v == NULL) return;
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

void store_nodes_free(store_node_t *v) { free(v); }

void store_copy_str(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n >= cap) n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
}
