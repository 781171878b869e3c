/*
 * sharded.c: the router of a sharded cluster's store (see sharded.h), a
 * backend of store.h whose every call goes to other stores: the control
 * database's PostgreSQL connection, and one per instance of the shard map.
 *
 * Where each call goes:
 *   control    channels (created there; read there by REST), membership,
 *              revocations, the shard map, the nodes gone (presence sweep)
 *   instance   a conversation and what hangs on it: create, get, append,
 *              replay, epoch, presence; a group commit is split by
 *              instance, one transaction on each
 *   every one  channel activation (its copies), epoch rotation of every
 *              conversation, the presence sweep and a node's presence rows
 * A channel's row is copied to an instance when the first conversation of
 * the channel is created there (conv_create), so that the reads of a hello
 * and the append's check of the channel stay on the conversation's own
 * instance: one round trip per shard involved.
 *
 * Errors: an instance that fails turns its calls' -CV_ESTORE and
 * -CV_ETIMEDOUT into -CV_ESHARD (the caller tells the client to retry
 * that conversation after a hint; the others go on), and marks it down
 * (sharded.h). The control database's failures keep their codes.
 *
 * Thread: the router is a store_t, owned by one pool worker; the shared
 * state (store_shards_t) is any thread's, under its mutex or atomics.
 */
#include "store/sharded.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "core/dburl.h"
#include "core/errors.h"
#include "core/log.h"
#include "core/shard.h"
#include "store/backend.h"

typedef struct {
  _Atomic int64_t down_until; /* monotonic ms; 0: up */
  _Atomic int probing;        /* a call is testing a down instance */
  _Atomic int inflight;
  _Atomic uint64_t calls, errors;
  _Atomic int migrated;  /* store_migrate succeeded on it since the start */
  store_shared_t shared; /* its connections' outage state (logged once) */
} inst_health_t;

struct store_shards_s {
  pthread_mutex_t mu; /* map, loaded */
  int loaded;
  store_shardmap_t map;
  _Atomic int64_t version; /* map.version once loaded: what routers compare theirs with */
  int inflight_max;
  metrics_t *metrics;
  inst_health_t inst[STORE_INSTANCES_MAX];
  uint64_t errors_exported[STORE_INSTANCES_MAX]; /* store_shards_export's last read (loop) */
};

typedef struct {
  struct store_s base;
  store_shards_t *sh;
  store_options_t opt; /* for the instances' connections: no shards, no NOTIFY */
  store_t *control;
  char *control_url;
  int n;
  char *urls[STORE_INSTANCES_MAX]; /* copies of the shared map's, as of `version` */
  uint8_t map[SHARD_COUNT];
  int64_t version; /* of the copy: refreshed before a call when the shared one is newer */
  store_t *inst[STORE_INSTANCES_MAX]; /* opened when first needed */
  int in_read;                        /* between read_begin and read_end */
  int read_open[STORE_INSTANCES_MAX]; /* its read transaction is open */
  int probe[STORE_INSTANCES_MAX];     /* the call under way on it is its probe */
} sd_t;

static sd_t *sd(store_t *base) { return container_of(base, sd_t, base); }

/* After a call on the control database: its deadline hit is the router's. */
static int ctl(sd_t *s, int err) {
  if (store_deadline_hit(s->control)) s->base.deadline_hit = 1;
  return err;
}

/* ---- shared state ------------------------------------------------------ */

store_shards_t *store_shards_new(int inflight_max, metrics_t *metrics) {
  store_shards_t *sh = calloc(1, sizeof *sh);
  if (!sh) return NULL;
  pthread_mutex_init(&sh->mu, NULL);
  sh->inflight_max = inflight_max < 1 ? 1 : inflight_max;
  sh->metrics = metrics;
  return sh;
}

void store_shards_free(store_shards_t *sh) {
  if (!sh) return;
  store_shardmap_clear(&sh->map);
  pthread_mutex_destroy(&sh->mu);
  free(sh);
}

int store_shards_count(store_shards_t *sh) {
  pthread_mutex_lock(&sh->mu);
  int n = sh->loaded ? sh->map.n : 0;
  pthread_mutex_unlock(&sh->mu);
  return n;
}

void store_shards_stats(store_shards_t *sh, int i, store_shard_stats_t *out, char *url,
                        size_t cap) {
  memset(out, 0, sizeof *out);
  if (url && cap) url[0] = '\0';
  if (i < 0 || i >= STORE_INSTANCES_MAX) return;
  inst_health_t *h = &sh->inst[i];
  out->up = atomic_load(&h->down_until) == 0;
  out->calls = atomic_load(&h->calls);
  out->errors = atomic_load(&h->errors);
  out->inflight = atomic_load(&h->inflight);
  pthread_mutex_lock(&sh->mu);
  if (url && cap && sh->loaded && i < sh->map.n) dburl_redact(sh->map.urls[i], url, cap);
  pthread_mutex_unlock(&sh->mu);
}

void store_shards_export(store_shards_t *sh) {
  if (!sh || !sh->metrics) return;
  int n = store_shards_count(sh);
  for (int i = 0; i < n; i++) {
    store_shard_stats_t st;
    store_shards_stats(sh, i, &st, NULL, 0);
    char labels[32];
    snprintf(labels, sizeof labels, "db_instance=\"%d\"", i);
    metrics_set(sh->metrics, "converger_shard_up", labels, st.up);
    metrics_add(sh->metrics, "converger_shard_errors_total", labels,
                st.errors - sh->errors_exported[i]);
    sh->errors_exported[i] = st.errors;
  }
}

int store_shards_instance_of(store_shards_t *sh, const char *conv) {
  pthread_mutex_lock(&sh->mu);
  int i = sh->loaded ? sh->map.map[shard_of(conv)] : -1;
  pthread_mutex_unlock(&sh->mu);
  return i;
}

/* This router's copy of the shared map brought up to date (outside a read
 * section, whose transactions are on the instances of the copy it began
 * with): the instance count, the shard -> instance table and the URLs; an
 * instance whose URL changed gets a new connection when next used.
 * Called before every call; a mutex only when the version changed. */
static int refresh(sd_t *s) {
  store_shards_t *sh = s->sh;
  if (s->in_read || (s->n > 0 && atomic_load(&sh->version) == s->version)) return 0;
  int err = 0;
  pthread_mutex_lock(&sh->mu);
  if (!sh->loaded) err = -CV_ENOTFOUND;
  for (int i = 0; !err && i < sh->map.n; i++) {
    if (s->urls[i] && strcmp(s->urls[i], sh->map.urls[i]) == 0) continue;
    char *u = strdup(sh->map.urls[i]);
    if (!u) {
      err = -CV_ENOMEM;
      break;
    }
    if (s->inst[i] != s->control) store_close(s->inst[i]);
    s->inst[i] = NULL;
    free(s->urls[i]);
    s->urls[i] = u;
  }
  if (!err) {
    s->n = sh->map.n;
    memcpy(s->map, sh->map.map, sizeof s->map);
    s->version = sh->map.version;
  }
  pthread_mutex_unlock(&sh->mu);
  return err;
}

/* The map read from the control database into the shared state when it
 * is newer than the one there (the first router's, a beat that saw a new
 * version, an instance that answered "moved"), then this router's copy
 * refreshed. */
static int reload_map(sd_t *s) {
  store_shards_t *sh = s->sh;
  store_shardmap_t m;
  int err = ctl(s, store_shardmap_get(s->control, &m));
  if (err == -CV_ENOTFOUND)
    log_error("store: the control database has no shard map; write one with "
              "`converger shards init` (docs/operations.md, \"Scaling out\")");
  else if (err)
    log_error("store: cannot read the shard map: %s", cv_strerror(err));
  if (err) return err;
  pthread_mutex_lock(&sh->mu);
  if (!sh->loaded || m.version > sh->map.version) {
    if (sh->loaded)
      log_info("store: shard map version %lld (was %lld), %d instance(s)", (long long)m.version,
               (long long)sh->map.version, m.n);
    else
      log_info("store: sharded over %d instance(s), map version %lld", m.n, (long long)m.version);
    store_shardmap_clear(&sh->map);
    sh->map = m;
    sh->loaded = 1;
    atomic_store(&sh->version, m.version);
  } else {
    store_shardmap_clear(&m);
  }
  pthread_mutex_unlock(&sh->mu);
  return refresh(s);
}

/* The map of the first router opened (the others copy it). */
static int load_map(sd_t *s) {
  pthread_mutex_lock(&s->sh->mu);
  int loaded = s->sh->loaded;
  pthread_mutex_unlock(&s->sh->mu);
  return loaded ? refresh(s) : reload_map(s);
}

/* An instance answered that conversation `conv`'s logical shard moved
 * away from it (its shard_moved row, written by `converger shards move`
 * after the map changed): the map read again. 0 when the conversation now
 * lives on another instance (call it there), else -CV_ESHARD (retry after
 * the hint). */
static int moved(sd_t *s, const char *conv, int from) {
  int err = reload_map(s);
  if (err) return -CV_ESHARD;
  int to = s->map[shard_of(conv)];
  if (to == from) {
    log_warn("store: instance %d says logical shard %d moved, but the map (version %lld) still "
             "names it",
             from, shard_of(conv), (long long)s->version);
    return -CV_ESHARD;
  }
  return 0;
}

/* ---- instances ----------------------------------------------------------- */

static int inst_of(const sd_t *s, const char *conv) { return s->map[shard_of(conv)]; }

static void mark_down(sd_t *s, int i) {
  inst_health_t *h = &s->sh->inst[i];
  if (atomic_exchange(&h->down_until, (int64_t)util_mono_ms() + STORE_SHARD_DOWN_MS) == 0) {
    char shown[512];
    dburl_redact(s->urls[i], shown, sizeof shown);
    log_warn("store: instance %d (%s) failed; its conversations get \"unavailable\" until it "
             "answers again (tried every %d ms)",
             i, shown, STORE_SHARD_DOWN_MS);
  }
}

/* Take instance `i` for one call: its connection in *db, open and with the
 * router's deadline (and its read transaction in a read section). 0, or
 * at once -CV_ESHARD (down and not this call's turn to probe, too many
 * calls inside it, cannot connect) or -CV_ETIMEDOUT (the deadline has
 * passed already: not the instance's fault). Every 0 is paired with
 * inst_put. */
static int inst_get(sd_t *s, int i, store_t **db) {
  inst_health_t *h = &s->sh->inst[i];
  uint64_t now = util_mono_ms();
  if (s->base.deadline_ms && now >= s->base.deadline_ms) {
    s->base.deadline_hit = 1;
    return -CV_ETIMEDOUT;
  }
  int64_t until = atomic_load(&h->down_until);
  int probe = 0;
  if (until != 0) { /* down: one call at a time tests it once the pause is over */
    if ((int64_t)now < until || atomic_exchange(&h->probing, 1) != 0) return -CV_ESHARD;
    probe = 1;
  }
  if (atomic_fetch_add(&h->inflight, 1) >= s->sh->inflight_max) {
    atomic_fetch_sub(&h->inflight, 1);
    if (probe) atomic_store(&h->probing, 0);
    return -CV_ESHARD;
  }
  atomic_fetch_add(&h->calls, 1);
  int err = 0;
  if (!s->inst[i] && strcmp(s->urls[i], s->control_url) == 0) {
    s->inst[i] = s->control; /* the control database is this instance too: one connection */
  } else if (!s->inst[i]) {
    store_options_t o = s->opt;
    o.shared = &h->shared;
    err = store_open(s->urls[i], &o, &s->inst[i]);
    if (!err && !atomic_load(&h->migrated)) {
      if ((err = store_migrate(s->inst[i])) == 0)
        atomic_store(&h->migrated, 1);
      else
        log_error("store: instance %d: migration failed: %s", i, cv_strerror(err));
    }
    if (err) {
      store_close(s->inst[i]);
      s->inst[i] = NULL;
    }
  }
  if (!err) {
    store_set_deadline(s->inst[i], s->base.deadline_ms);
    if (s->in_read && !s->read_open[i] && (err = store_read_begin(s->inst[i])) == 0)
      s->read_open[i] = 1;
  }
  if (err) {
    atomic_fetch_sub(&h->inflight, 1);
    atomic_fetch_add(&h->errors, 1);
    mark_down(s, i);
    if (probe) atomic_store(&h->probing, 0);
    return -CV_ESHARD;
  }
  *db = s->inst[i];
  s->probe[i] = probe;
  return 0;
}

/* The call on instance `i` (taken at monotonic `t0`) returned `err`:
 * release the instance, record the outcome (a success ends its being
 * down), and turn its failure into -CV_ESHARD. */
static int inst_put(sd_t *s, int i, int err, uint64_t t0) {
  inst_health_t *h = &s->sh->inst[i];
  atomic_fetch_sub(&h->inflight, 1);
  if (store_deadline_hit(s->inst[i])) s->base.deadline_hit = 1;
  char labels[32];
  snprintf(labels, sizeof labels, "db_instance=\"%d\"", i);
  metrics_observe_labels(s->sh->metrics, "converger_shard_store_ms", labels,
                         (double)(util_mono_ms() - t0));
  /* A deadline hit counts against the instance only when the call itself
   * waited long: a job that reached it with little of its budget left
   * (it waited in the pool's queue) says nothing about the instance. */
  uint64_t took = util_mono_ms() - t0;
  int failed = err == -CV_ESTORE || (err == -CV_ETIMEDOUT && took >= STORE_SHARD_SLOW_MS);
  if (failed) {
    atomic_fetch_add(&h->errors, 1);
    mark_down(s, i);
  } else if (err != -CV_ETIMEDOUT && atomic_exchange(&h->down_until, 0) != 0) {
    log_info("store: instance %d answers again", i);
  }
  /* A read section's transaction that a failure may have aborted (or
   * whose connection is gone) is ended here, so that the connection is
   * usable (and can reconnect) at its next call; a later call of the
   * section begins another. */
  if (s->read_open[i] && (failed || err == -CV_ETIMEDOUT || err == -CV_EBUSY)) {
    store_read_end(s->inst[i]);
    s->read_open[i] = 0;
  }
  if (s->probe[i]) { /* this call was the probe of a down instance */
    s->probe[i] = 0;
    atomic_store(&h->probing, 0);
  }
  return failed ? -CV_ESHARD : err;
}

/* The instance of `conv`, taken: see inst_get. */
#define ON_CONV(s, conv, i, db, t0)                                                                \
  int err_ = refresh(s);                                                                           \
  if (err_) return err_;                                                                           \
  int i = inst_of(s, conv);                                                                        \
  store_t *db = NULL;                                                                              \
  uint64_t t0 = util_mono_ms();                                                                    \
  err_ = inst_get(s, i, &db);                                                                      \
  if (err_) return err_

/* `call` (an expression of `db`, the conversation's instance) returned
 * as the op's result; when the instance answers that the shard moved, the
 * map is read again and `call` made once more on its new instance (the
 * writes, and store_conv_get, which every hello, subscribe and heads check
 * makes first). The caller never sees -CV_EMOVED. */
#define CONV_WRITE(s, conv, db, call)                                                              \
  for (int try_ = 0;; try_++) {                                                                    \
    int e_ = refresh(s);                                                                           \
    if (e_) return e_;                                                                             \
    int i_ = inst_of(s, conv);                                                                     \
    store_t *db = NULL;                                                                            \
    uint64_t t0_ = util_mono_ms();                                                                 \
    if ((e_ = inst_get(s, i_, &db)) != 0) return e_;                                               \
    e_ = inst_put(s, i_, (call), t0_);                                                             \
    if (e_ != -CV_EMOVED) return e_;                                                               \
    if (try_ > 0 || moved(s, conv, i_) != 0) return -CV_ESHARD;                                    \
  }

/* ---- the ops ------------------------------------------------------------ */

static void op_close(store_t *base) {
  sd_t *s = sd(base);
  for (int i = 0; i < STORE_INSTANCES_MAX; i++) {
    if (s->inst[i] != s->control) store_close(s->inst[i]);
    free(s->urls[i]);
  }
  store_close(s->control);
  free(s->control_url);
  free(s);
}

static int op_open(const char *url, const store_options_t *opt, store_t **out) {
  sd_t *s = calloc(1, sizeof *s);
  if (!s) return -CV_ENOMEM;
  s->base.ops = &store_sharded_ops;
  s->sh = opt->shards;
  s->opt = *opt;
  s->opt.shards = NULL;
  s->opt.notify = 0; /* the bus carries what NOTIFY did (sharded mode) */
  s->opt.guard = 1;  /* every write passes its shard's guard (a move's freeze) */
  store_options_t c = s->opt;
  int err = (s->control_url = strdup(url)) ? store_open(url, &c, &s->control) : -CV_ENOMEM;
  if (!err) err = load_map(s);
  if (err) {
    op_close(&s->base);
    return err;
  }
  *out = &s->base;
  return 0;
}

/* The control database first (its failure is the store's); then each
 * instance that answers (one that does not is migrated when first
 * reached: the node starts with a shard down). */
static int op_migrate(store_t *base) {
  sd_t *s = sd(base);
  int err = store_migrate(s->control);
  if (err) return err;
  if ((err = load_map(s)) != 0) return err;
  for (int i = 0; i < s->n; i++) {
    store_t *db;
    uint64_t t0 = util_mono_ms();
    if (inst_get(s, i, &db) == 0) (void)inst_put(s, i, 0, t0);
  }
  return 0;
}

static int op_schema_version(store_t *base) { return store_schema_version(sd(base)->control); }

static int op_read_begin(store_t *base) {
  sd_t *s = sd(base);
  int err = refresh(s); /* the section reads by one copy of the map */
  if (!err) s->in_read = 1;
  return err;
}

static void op_read_end(store_t *base) {
  sd_t *s = sd(base);
  for (int i = 0; i < s->n; i++)
    if (s->read_open[i]) {
      store_read_end(s->inst[i]);
      s->read_open[i] = 0;
    }
  s->in_read = 0;
}

static int op_ping(store_t *base) { return store_ping(sd(base)->control); }

static void op_set_deadline(store_t *base, uint64_t deadline_ms) {
  sd_t *s = sd(base);
  store_set_deadline(s->control, deadline_ms);
}

static int op_channel_create(store_t *base, const char *id, const char *name, unsigned flags,
                             store_channel_t *out) {
  sd_t *s = sd(base);
  return ctl(s, store_channel_create(s->control, id, name, flags, out));
}

static int op_channel_get(store_t *base, const char *id, store_channel_t *out) {
  sd_t *s = sd(base);
  return ctl(s, store_channel_get(s->control, id, out));
}

/* Every instance's copy first, then the control database's row, so that
 * when the control database says it is done no instance appends to it
 * any more; an instance that fails fails the whole change (retry it:
 * setting a state twice is harmless). Then announced to every node. */
static int op_channel_set_active(store_t *base, const char *id, int active, store_channel_t *out) {
  sd_t *s = sd(base);
  int e = refresh(s);
  if (e) return e;
  for (int i = 0; i < s->n; i++) {
    store_t *db;
    uint64_t t0 = util_mono_ms();
    int err = inst_get(s, i, &db);
    if (err) return err;
    err = store_channel_set_active(db, id, active, NULL);
    err = inst_put(s, i, err == -CV_ENOTFOUND ? 0 : err, t0); /* no copy there: nothing to do */
    if (err) return err;
  }
  int err = ctl(s, store_channel_set_active(s->control, id, active, out));
  if (!err && s->opt.announce) {
    char payload[STORE_ID_MAX + 8];
    snprintf(payload, sizeof payload, "c %d %s", active ? 1 : 0, id);
    s->opt.announce(s->opt.announce_ud, payload);
  }
  return err;
}

/* The channel's row on the conversation's instance, copied from the
 * control database: created with its flags, then its state read again
 * and set, so that a change made while it was copied is not lost. */
static int copy_channel(sd_t *s, store_t *db, const char *channel) {
  store_channel_t ch;
  int err = ctl(s, store_channel_get(s->control, channel, &ch));
  if (err) return err;
  unsigned flags =
      (ch.presence ? STORE_CHANNEL_PRESENCE : 0) | (ch.signals ? STORE_CHANNEL_SIGNALS : 0);
  err = store_channel_create(db, channel, ch.name, flags, NULL);
  if (err && err != -CV_EEXISTS) return err;
  if ((err = ctl(s, store_channel_get(s->control, channel, &ch))) != 0) return err;
  return store_channel_set_active(db, channel, ch.active, NULL);
}

/* The conversation on `db`, with its channel's row copied there first
 * when it is the channel's first conversation on that instance. */
static int conv_create_on(sd_t *s, store_t *db, const char *id, const char *channel,
                          store_conv_t *out) {
  int err = store_conv_create(db, id, channel, out);
  if (err == -CV_ENOTFOUND) {
    err = copy_channel(s, db, channel);
    if (!err) err = store_conv_create(db, id, channel, out);
  }
  return err;
}

static int op_conv_create(store_t *base, const char *id, const char *channel, store_conv_t *out) {
  sd_t *s = sd(base);
  CONV_WRITE(s, id, db, conv_create_on(s, db, id, channel, out));
}

/* Guarded as a write is: a node still on the old map is sent to the new
 * instance instead of reading the moved shard's frozen copy. */
static int op_conv_get(store_t *base, const char *id, store_conv_t *out) {
  sd_t *s = sd(base);
  CONV_WRITE(s, id, db, store_conv_get(db, id, out));
}

static int op_append(store_t *base, const char *conv, const char *id, const char *sender,
                     const char *body, int64_t ts_ms, store_msg_t *out, int *created) {
  sd_t *s = sd(base);
  CONV_WRITE(s, conv, db, store_append(db, conv, id, sender, body, ts_ms, out, created));
}

/* One group commit per instance, in the order of the instances; an
 * instance that fails fails only its own items. Each item gets its own
 * status: the group as a whole never fails. */
static int batch_once(sd_t *s, store_append_t *const *items, size_t n) {
  int e = refresh(s);
  if (e) {
    for (size_t j = 0; j < n; j++) items[j]->status = e;
    return 0;
  }
  store_append_t **part = malloc(n * sizeof *part);
  if (!part) return -CV_ENOMEM;
  for (int i = 0; i < s->n; i++) {
    size_t k = 0;
    for (size_t j = 0; j < n; j++)
      if (inst_of(s, items[j]->conv) == i) part[k++] = items[j];
    if (k == 0) continue;
    store_t *db;
    uint64_t t0 = util_mono_ms();
    int err = inst_get(s, i, &db);
    if (!err) err = inst_put(s, i, store_append_batch(db, part, k), t0);
    for (size_t j = 0; err && j < k; j++) {
      if (part[j]->status == 0) part[j]->created = 0;
      if (part[j]->status == 0 || part[j]->status == -CV_ESTORE || part[j]->status == -CV_ETIMEDOUT)
        part[j]->status = err;
    }
    for (size_t j = 0; !err && j < k; j++) /* an item's own failure of the instance */
      if (part[j]->status == -CV_ESTORE || part[j]->status == -CV_ETIMEDOUT)
        part[j]->status = -CV_ESHARD;
  }
  free(part);
  return 0;
}

/* As batch_once; the items whose instance answered that their shard moved
 * are appended once more after the map is read again (CONV_WRITE), and
 * get -CV_ESHARD when it still names that instance. */
static int op_append_batch(store_t *base, store_append_t *const *items, size_t n) {
  sd_t *s = sd(base);
  int err = batch_once(s, items, n);
  if (err) return err;
  store_append_t **again = NULL;
  size_t k = 0;
  for (size_t j = 0; j < n; j++) {
    if (items[j]->status != -CV_EMOVED) continue;
    if (!again && !(again = malloc(n * sizeof *again))) {
      for (size_t m = j; m < n; m++) /* the caller never sees -CV_EMOVED */
        if (items[m]->status == -CV_EMOVED) items[m]->status = -CV_ESHARD;
      return 0;
    }
    items[j]->status = 0;
    again[k++] = items[j];
  }
  if (k == 0) return 0;
  (void)moved(s, again[0]->conv, inst_of(s, again[0]->conv)); /* the map read again */
  err = batch_once(s, again, k);
  for (size_t j = 0; j < k; j++)
    if (err || again[j]->status == -CV_EMOVED) { /* not where the map says, yet */
      store_msg_clear(&again[j]->msg);
      memset(&again[j]->msg, 0, sizeof again[j]->msg);
      again[j]->created = 0;
      again[j]->status = -CV_ESHARD;
    }
  free(again);
  return 0;
}

static int op_replay(store_t *base, const char *conv, int64_t after, int64_t upto, int limit,
                     size_t max_bytes, store_msg_t **msgs, size_t *n) {
  sd_t *s = sd(base);
  ON_CONV(s, conv, i, db, t0);
  return inst_put(s, i, store_replay(db, conv, after, upto, limit, max_bytes, msgs, n), t0);
}

static int op_epoch_rotate(store_t *base, const char *conv, int64_t *count) {
  sd_t *s = sd(base);
  if (conv) {
    CONV_WRITE(s, conv, db, store_epoch_rotate(db, conv, count));
  }
  int err = refresh(s);
  if (err) return err;
  *count = 0;
  for (int i = 0; i < s->n; i++) {
    store_t *db;
    int64_t k = 0;
    uint64_t t0 = util_mono_ms();
    err = inst_get(s, i, &db);
    if (!err) err = inst_put(s, i, store_epoch_rotate(db, NULL, &k), t0);
    if (err) return err;
    *count += k;
  }
  return 0;
}

static int op_revoke(store_t *base, const char *jti, int64_t exp_s) {
  sd_t *s = sd(base);
  return ctl(s, store_revoke(s->control, jti, exp_s));
}

static int op_revocations(store_t *base, int64_t now_s, char ***jtis, size_t *n) {
  sd_t *s = sd(base);
  return ctl(s, store_revocations(s->control, now_s, jtis, n));
}

static int op_node_beat(store_t *base, const char *id, const char *public_url,
                        const char *admin_url, const char *state, int64_t connections,
                        int64_t waiters, int64_t capacity, int64_t now_ms) {
  sd_t *s = sd(base);
  int err = ctl(s, store_node_beat(s->control, id, public_url, admin_url, state, connections,
                                   waiters, capacity, now_ms));
  if (err) return err;
  /* The map version: this node's recorded, the control database's read in
   * the same statement; a newer one is read at once, and recorded. */
  int64_t used = atomic_load(&s->sh->version), cur = 0;
  int e = ctl(s, store_shardmap_sync(s->control, id, used, &cur));
  if (!e && cur > used && reload_map(s) == 0)
    e = ctl(s, store_shardmap_sync(s->control, id, atomic_load(&s->sh->version), &cur));
  if (e) log_debug("store: shard map version not synced: %s", cv_strerror(e));
  return 0;
}

static int op_nodes_live(store_t *base, int64_t since_ms, store_node_t **out, size_t *n) {
  sd_t *s = sd(base);
  /* store_nodes_live takes an age; the backend got the cut-off */
  return ctl(s, store_nodes_live(s->control, since_ms, 0, out, n));
}

static int op_nodes_gone(store_t *base, int64_t since_ms, char ***ids, size_t *n) {
  sd_t *s = sd(base);
  return ctl(s, store_nodes_gone(s->control, since_ms, 0, ids, n));
}

static int op_shardmap_get(store_t *base, store_shardmap_t *out) {
  sd_t *s = sd(base);
  return ctl(s, store_shardmap_get(s->control, out));
}

static int op_shardmap_init(store_t *base, const char *const *urls, int n) {
  sd_t *s = sd(base);
  return ctl(s, store_shardmap_init(s->control, urls, n));
}

static int op_shardmap_sync(store_t *base, const char *node, int64_t used, int64_t *current) {
  sd_t *s = sd(base);
  return ctl(s, store_shardmap_sync(s->control, node, used, current));
}

static int op_announce(store_t *base, const char *payload) {
  sd_t *s = sd(base);
  if (s->opt.announce) s->opt.announce(s->opt.announce_ud, payload);
  return 0;
}

static int op_presence_join(store_t *base, const char *conv, const char *client, const char *user,
                            const char *node, int64_t since_ms, int *joined, int *first) {
  sd_t *s = sd(base);
  CONV_WRITE(s, conv, db,
             store_presence_join(db, conv, client, user, node, since_ms, joined, first));
}

static int op_presence_leave(store_t *base, const char *conv, const char *client, const char *user,
                             const char *node, int *left, int *last) {
  sd_t *s = sd(base);
  CONV_WRITE(s, conv, db, store_presence_leave(db, conv, client, user, node, left, last));
}

static int op_presence_list(store_t *base, const char *conv, const char *after, int limit,
                            store_member_t **out, size_t *n, int64_t *count) {
  sd_t *s = sd(base);
  ON_CONV(s, conv, i, db, t0);
  return inst_put(s, i, store_presence_list(db, conv, after, limit, out, n, count), t0);
}

/* The gone nodes from the control database, then their rows on every
 * instance that answers (one that does not is swept by a later beat). */
static int op_presence_sweep(store_t *base, int64_t since_ms, int64_t *removed) {
  sd_t *s = sd(base);
  char **gone = NULL;
  size_t ngone = 0;
  int err = refresh(s);
  if (!err) err = ctl(s, store_nodes_gone(s->control, since_ms, 0, &gone, &ngone));
  if (err || ngone == 0) return err;
  *removed = 0;
  for (int i = 0; i < s->n; i++) {
    store_t *db;
    int64_t k = 0;
    uint64_t t0 = util_mono_ms();
    if (inst_get(s, i, &db) != 0) continue;
    if (inst_put(s, i, store_presence_sweep_nodes(db, gone, ngone, &k), t0) == 0) *removed += k;
  }
  store_strings_free(gone, ngone);
  return 0;
}

static int op_presence_sweep_nodes(store_t *base, char *const *nodes, size_t n, int64_t *removed) {
  sd_t *s = sd(base);
  int e = refresh(s);
  if (e) return e;
  *removed = 0;
  for (int i = 0; i < s->n; i++) {
    store_t *db;
    int64_t k = 0;
    uint64_t t0 = util_mono_ms();
    int err = inst_get(s, i, &db);
    if (!err) err = inst_put(s, i, store_presence_sweep_nodes(db, nodes, n, &k), t0);
    if (err) return err;
    *removed += k;
  }
  return 0;
}

/* Appends `add` (n rows, taken) to *v (*len rows). */
static int strings_cat(char ***v, size_t *len, char **add, size_t n) {
  if (n == 0) {
    free(add);
    return 0;
  }
  char **w = realloc(*v, (*len + n) * sizeof *w);
  if (!w) {
    store_strings_free(add, n);
    return -CV_ENOMEM;
  }
  memcpy(w + *len, add, n * sizeof *w);
  free(add);
  *v = w;
  *len += n;
  return 0;
}

static int op_presence_of_node(store_t *base, const char *node, char ***convs, char ***clients,
                               char ***users, size_t *n) {
  sd_t *s = sd(base);
  size_t lc = 0, lk = 0, lu = 0;
  int err = refresh(s);
  for (int i = 0; i < s->n && !err; i++) {
    store_t *db;
    char **c, **k, **u;
    size_t m = 0;
    uint64_t t0 = util_mono_ms();
    if ((err = inst_get(s, i, &db)) != 0) break;
    err = inst_put(s, i, store_presence_of_node(db, node, &c, &k, &u, &m), t0);
    if (err) break;
    int e1 = strings_cat(convs, &lc, c, m), e2 = strings_cat(clients, &lk, k, m),
        e3 = strings_cat(users, &lu, u, m);
    err = e1 ? e1 : e2 ? e2 : e3;
  }
  if (err) {
    store_strings_free(*convs, lc);
    store_strings_free(*clients, lk);
    store_strings_free(*users, lu);
    *convs = *clients = *users = NULL;
    return err;
  }
  *n = lc;
  return 0;
}

int store_shards_probe_due(store_shards_t *sh) {
  int n = store_shards_count(sh);
  int64_t now = (int64_t)util_mono_ms();
  for (int i = 0; i < n; i++) {
    int64_t until = atomic_load(&sh->inst[i].down_until);
    if (until != 0 && now >= until && !atomic_load(&sh->inst[i].probing)) return 1;
  }
  return 0;
}

int store_shards_probe(store_t *router) {
  if (!router || router->ops != &store_sharded_ops) return -CV_EINVAL;
  sd_t *s = sd(router);
  int e = refresh(s);
  if (e) return e;
  for (int i = 0; i < s->n; i++) {
    int64_t until = atomic_load(&s->sh->inst[i].down_until);
    if (until == 0 || (int64_t)util_mono_ms() < until) continue;
    store_t *db;
    uint64_t t0 = util_mono_ms();
    if (inst_get(s, i, &db) == 0) (void)inst_put(s, i, store_ping(db), t0);
  }
  return 0;
}

const store_ops_t store_sharded_ops = {
    .name = "sharded",
    .open = op_open,
    .close = op_close,
    .migrate = op_migrate,
    .schema_version = op_schema_version,
    .read_begin = op_read_begin,
    .read_end = op_read_end,
    .ping = op_ping,
    .set_deadline = op_set_deadline,
    .channel_create = op_channel_create,
    .channel_get = op_channel_get,
    .channel_set_active = op_channel_set_active,
    .conv_create = op_conv_create,
    .conv_get = op_conv_get,
    .append = op_append,
    .append_batch = op_append_batch,
    .replay = op_replay,
    .epoch_rotate = op_epoch_rotate,
    .revoke = op_revoke,
    .revocations = op_revocations,
    .node_beat = op_node_beat,
    .nodes_live = op_nodes_live,
    .announce = op_announce,
    .presence_join = op_presence_join,
    .presence_leave = op_presence_leave,
    .presence_list = op_presence_list,
    .presence_sweep = op_presence_sweep,
    .presence_sweep_nodes = op_presence_sweep_nodes,
    .nodes_gone = op_nodes_gone,
    .shardmap_get = op_shardmap_get,
    .shardmap_init = op_shardmap_init,
    .shardmap_sync = op_shardmap_sync,
    .presence_of_node = op_presence_of_node,
};
