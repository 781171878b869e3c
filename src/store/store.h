/*
 * store: the one interface to converger's durable state.
 *
 * A store_t is one database connection. It is owned by exactly one pool
 * worker thread (see pool.h) and must only be used from that thread; all
 * functions here block. store_open picks the backend from the URL:
 *   "sqlite:PATH"                          SQLite (sqlite.c), one machine
 *   "postgres://..." or "postgresql://..." PostgreSQL (postgres.c, libpq),
 *   or a libpq keyword string              shared by every node of a cluster
 *   ("host=... dbname=...")
 * Every other function dispatches to the backend of its store (store.c
 * checks the arguments once, the backends do the database work; see
 * backend.h).
 *
 * Semantics every backend must keep (DESIGN.md, "Delivery guarantees"):
 *  - per conversation, seq starts at 1 and is gapless, also under concurrent
 *    writers on other connections (the head is bumped under the
 *    conversation's write lock in the same transaction as the insert);
 *  - the client message id is an idempotency key unique per conversation:
 *    appending the same id again returns the first seq and does not insert;
 *  - replay returns messages in ascending seq, at most `limit` per call.
 *
 * Errors: 0 on success, -CV_ENOTFOUND, -CV_EEXISTS, -CV_EINACTIVE,
 * -CV_EINVAL, -CV_EBUSY (lock not obtained in time), -CV_ETIMEDOUT (the
 * deadline of store_set_deadline passed), -CV_ESTORE (anything else,
 * including a database that cannot be reached; the backend logs the
 * database's own message).
 */
#ifndef CONVERGER_STORE_STORE_H
#define CONVERGER_STORE_STORE_H

#include <stddef.h>
#include <stdint.h>

#define STORE_ID_MAX          128  /* ids match [A-Za-z0-9._:-]{1,128} */
#define STORE_NAME_MAX        256  /* channel display name, bytes */
#define STORE_REPLAY_PAGE_MAX 1000 /* messages per replay page */
#define STORE_URL_MAX         512  /* a node's public URL, bytes */
#define STORE_NODE_STATE_MAX  15   /* "ready", "draining" */
#define STORE_EPOCH_MAX       16   /* a conversation's epoch: lowercase hex, 8 chars today */

typedef struct store_s store_t;

typedef enum {
  STORE_SYNC_OFF = 0,
  STORE_SYNC_NORMAL = 1,
  STORE_SYNC_FULL = 2,
} store_sync_t;

typedef struct {
  char id[STORE_ID_MAX + 1];
  char name[STORE_NAME_MAX + 1];
  int presence; /* 0 or 1 */
  int active;   /* 0 or 1 */
  int signals;  /* 0 or 1: its conversations carry signals (docs/protocol.md 4.10) */
} store_channel_t;

/* store_channel_create's flags. */
#define STORE_CHANNEL_PRESENCE 1u /* presence: true (1 is what callers of old passed) */
#define STORE_CHANNEL_SIGNALS  2u /* signals: true */

typedef struct {
  char id[STORE_ID_MAX + 1];
  char channel[STORE_ID_MAX + 1];
  int64_t head;       /* last seq assigned; 0 for an empty conversation */
  int channel_active; /* from the channel row, read in the same query */
  int presence;       /* from the channel row */
  int signals;        /* from the channel row */
  /* The identity of the conversation's history (docs/protocol.md,
   * "Epochs"): drawn at random when the conversation is created and again
   * by store_epoch_rotate, after a backup is restored. A seq means the same
   * message only under the same epoch. */
  char epoch[STORE_EPOCH_MAX + 1];
} store_conv_t;

/* One stored message. `sender` and `body` are heap strings owned by the
 * struct (free with store_msgs_free or store_msg_clear). `body` is JSON text
 * exactly as it was given to store_append. */
typedef struct {
  int64_t seq;
  char id[STORE_ID_MAX + 1];
  char *sender;
  char *body;
  int64_t ts_ms;                   /* commit time, ms since the Unix epoch, UTC */
  char epoch[STORE_EPOCH_MAX + 1]; /* its conversation's epoch when it was read or appended */
} store_msg_t;

/* Cross-node fan-out (PostgreSQL only). With store_options_t.notify set,
 * the transaction that appends a message or changes a channel's state also
 * does NOTIFY on STORE_NOTIFY_CHANNEL, so every node's listener
 * (bus/pgnotify.c) hears of it once it commits, in commit order. The
 * payloads (text, at most STORE_NOTIFY_PAYLOAD_MAX bytes, PostgreSQL's
 * limit) have a format of their own: store/notify.h. */
#define STORE_NOTIFY_CHANNEL     "converger"
#define STORE_NOTIFY_PAYLOAD_MAX 7999

/* What the connections of one owner share (the pool's workers: one per
 * pool, so two nodes in one process share nothing). Owned by whoever opens
 * the connections, which must outlive them; any thread. */
typedef struct {
  /* PostgreSQL: a connect failed and none has succeeded since, so an
   * outage is logged once, not once per connection per try. */
  _Atomic int connect_failing;
} store_shared_t;

/* A sharded cluster's map and the health of its instances, shared by the
 * connections of one node (store/sharded.h). */
typedef struct store_shards_s store_shards_t;

/* What a committed transaction announces to every node, when the store
 * does not NOTIFY (a sharded cluster: the node's bus carries it). Called
 * on the store's thread after the COMMIT, with a payload of store/notify.h
 * the callee copies. */
typedef void (*store_announce_cb)(void *ud, const char *payload);

typedef struct {
  store_sync_t sync;      /* SQLite PRAGMA synchronous (PostgreSQL: ignored) */
  int busy_timeout_ms;    /* how long to wait for a lock (SQLite busy timeout,
                             PostgreSQL lock_timeout); 0 = 5000 */
  int notify;             /* PostgreSQL: NOTIFY as above (SQLite: ignored) */
  store_shared_t *shared; /* borrowed; NULL: the connection keeps its own */
  /* Sharded (borrowed; NULL: one database): the URL is the control
   * database's, and each conversation's rows live on the instance its
   * logical shard is mapped to (store/sharded.h). */
  store_shards_t *shards;
  /* PostgreSQL without `notify`: presence changes (store_presence_*), and
   * a sharded store's channel changes and store_announce, go here after
   * their COMMIT. NULL: not announced. */
  store_announce_cb announce;
  void *announce_ud;
  /* PostgreSQL, a sharded cluster's instance (set by the router,
   * store/sharded.h): every write of a conversation's rows first passes
   * its logical shard's guard in the same transaction (migration 9,
   * converger_shard_guard): -CV_ESHARD while `converger shards move`
   * freezes the shard, -CV_EMOVED once the shard lives on another
   * instance. 0 (one database): no guard, the statements of before. */
  int guard;
} store_options_t;

/* One row of the cluster's membership table: a node's last heartbeat. */
typedef struct {
  char id[STORE_ID_MAX + 1];
  char public_url[STORE_URL_MAX + 1];   /* the ws URL clients should use for it */
  char admin_url[STORE_URL_MAX + 1];    /* http URL of its admin listener; "" none (migration 6) */
  char state[STORE_NODE_STATE_MAX + 1]; /* "ready" or "draining" */
  int64_t connections;                  /* its WebSocket connections */
  int64_t waiters;                      /* its admission waiters */
  int64_t capacity;                     /* connections it is sized for; 0: not set */
  int64_t updated_ms;                   /* wall clock of the beat, ms since the Unix epoch */
} store_node_t;

/* The URL forms: core/dburl.h (dburl_backend, dburl_redact). */

/* Open a connection for `url` (see above). SQLite: PATH is relative to the
 * current directory and its directory must exist; sets WAL mode, the
 * synchronous level and the busy timeout from `opt`. PostgreSQL: connects
 * within the URL's connect_timeout (seconds; default 1 s), with TCP
 * keepalives, and sets lock_timeout from `opt`; a connection found broken
 * later is re-established by the next call (outside a read transaction).
 * `opt` NULL = defaults: FULL, 5000 ms. On success *out is a new store the
 * caller closes with store_close. Does not migrate. Returns -CV_EINVAL for
 * an unsupported URL or bad options, -CV_ESTORE when the database cannot
 * be opened or reached. */
int store_open(const char *url, const store_options_t *opt, store_t **out);

/* Close and free. NULL is allowed. */
void store_close(store_t *s);

/* Create or upgrade the schema to the current version (table
 * schema_version, one row per applied migration), in one transaction.
 * Safe to call from several connections: only one applies each step. */
int store_migrate(store_t *s);

/* Schema version after store_migrate (number of applied migrations), or a
 * negative error. */
int store_schema_version(store_t *s);

/* Group the reads that follow (store_conv_get, store_replay, ...) into one
 * read transaction, one snapshot and one lock cycle, until store_read_end.
 * For reads only: an append inside it fails. store_read_end is a no-op
 * when no transaction is open. */
int store_read_begin(store_t *s);
void store_read_end(store_t *s);

/* Cheap liveness check (SELECT 1). */
int store_ping(store_t *s);

/* Bound the calls that follow on `s` by `deadline_ms` (monotonic ms, as
 * util_mono_ms; 0: no deadline, only the backend's own limits) until the
 * next store_set_deadline, and forget whether the last one was hit. The
 * pool sets the deadline of each job around its work (pool.h). A call
 * that reaches it fails with -CV_ETIMEDOUT:
 *  - PostgreSQL: no statement is sent after it; the answer to one sent
 *    before it is waited for at most until it (and until the statement
 *    timeout plus a margin in any case); a connect attempt stops at it.
 *    A statement given up on closes the connection, so the server rolls
 *    back what was not committed and the next call connects again. A
 *    COMMIT whose answer did not come in time may or may not have
 *    committed: it is reported as this failure, never as success, and the
 *    caller retries an append with the same id (the idempotency key).
 *  - SQLite: a lock wait stops at the deadline or the busy timeout,
 *    whichever comes first; a running statement is interrupted once it has
 *    passed (COMMIT and ROLLBACK are not: they never wait for a lock once
 *    the transaction holds its own); the transaction is rolled back.
 * Thread: the store's owner. Never fails. */
void store_set_deadline(store_t *s, uint64_t deadline_ms);

/* 1 when a call since the last store_set_deadline stopped at its deadline
 * (returned -CV_ETIMEDOUT), else 0. Thread: the store's owner. */
int store_deadline_hit(const store_t *s);

/* Channels. create: `flags` STORE_CHANNEL_*; -CV_EEXISTS if the id is taken. get/set_active:
 * -CV_ENOTFOUND if missing. `out` may be NULL. */
int store_channel_create(store_t *s, const char *id, const char *name, unsigned flags,
                         store_channel_t *out);
int store_channel_get(store_t *s, const char *id, store_channel_t *out);
int store_channel_set_active(store_t *s, const char *id, int active, store_channel_t *out);

/* Conversations. create: -CV_ENOTFOUND if the channel is missing,
 * -CV_EEXISTS if the id is taken; head starts at 0. get: the conversation
 * with its head and its channel's active/presence flags in one read. */
int store_conv_create(store_t *s, const char *id, const char *channel, store_conv_t *out);
int store_conv_get(store_t *s, const char *id, store_conv_t *out);

/* Append one message in one transaction: seq = head + 1 under the write
 * lock, insert, commit. `id` is the idempotency key (required). `body` is
 * JSON text (stored as given). `ts_ms` is the timestamp to record.
 * On success fills `out` (caller clears it with store_msg_clear) and sets
 * *created to 1, or to 0 when `id` already existed in `conv` (then `out` is
 * the first message with that id, unchanged). -CV_ENOTFOUND when the
 * conversation does not exist, -CV_EINACTIVE when its channel is inactive. */
int store_append(store_t *s, const char *conv, const char *id, const char *sender, const char *body,
                 int64_t ts_ms, store_msg_t *out, int *created);

/* One append of a group commit (store_append_batch): the arguments of
 * store_append, borrowed from the caller for the call, and its results. */
typedef struct {
  const char *conv, *id, *sender, *body; /* as store_append's */
  int64_t ts_ms;
  int status;      /* 0, or what store_append would have returned */
  int created;     /* as store_append's *created */
  store_msg_t msg; /* as store_append's *out: cleared by the caller (store_msg_clear) */
} store_append_t;

/* Group commit: append `n` messages (1..STORE_BATCH_MAX) in one
 * transaction, in array order, with exactly the semantics of n
 * store_append calls made one after the other: per conversation seqs stay
 * gapless and in array order, and a repeated (conv, id), in the database
 * or earlier in the array, answers with the first message.
 * A conversation that is missing or inactive fails only its own items
 * (-CV_ENOTFOUND, -CV_EINACTIVE in items[i]->status); the others commit.
 * When the group itself fails for another reason (a constraint, a lost
 * connection, out of memory), it is rolled back and the items are
 * appended one transaction each, so that each item fails only when it
 * must; only the deadline (store_set_deadline) or -CV_EBUSY fails them all
 * together, each with that status. PostgreSQL: one round trip (the
 * function converger_append_batch, migration 7) and, with
 * store_options_t.notify, one NOTIFY per STORE_NOTIFY_PAYLOAD_MAX bytes of
 * new messages (store/notify.h, the "b" payload). Returns 0 when every
 * item has its own status, or the error all of them got. Thread: the
 * store's owner. */
#define STORE_BATCH_MAX 1024
int store_append_batch(store_t *s, store_append_t *const *items, size_t n);

/* Replay: messages with after < seq <= upto (upto < 0: no upper bound), in
 * ascending seq, at most `limit` (1..STORE_REPLAY_PAGE_MAX; larger values are
 * clamped) and, when max_bytes > 0, no more once the page holds max_bytes
 * bytes of bodies and senders (a page always holds at least one message, so
 * paging always progresses). On success *msgs is a heap array of *n messages
 * (NULL when 0) that the caller frees with store_msgs_free. -CV_ENOTFOUND
 * when the conversation does not exist. */
int store_replay(store_t *s, const char *conv, int64_t after, int64_t upto, int limit,
                 size_t max_bytes, store_msg_t **msgs, size_t *n);

void store_msg_clear(store_msg_t *m);

/* Give conversation `conv` (NULL: every conversation) a new epoch, so that
 * a client resuming with a watermark of the history it had is told to
 * reset instead of being served a different history under the same seqs
 * (after a backup is restored: docs/operations.md). The new epoch always
 * differs from the old one. *count (may be NULL) is the number of
 * conversations changed. -CV_ENOTFOUND when `conv` does not exist. */
int store_epoch_rotate(store_t *s, const char *conv, int64_t *count);
void store_msgs_free(store_msg_t *msgs, size_t n);

/* Token revocation list. revoke: idempotent; `exp_s` is the token's expiry
 * (Unix seconds) after which the row may be forgotten. list: every jti whose
 * exp_s >= now_s, as a heap array of heap strings (free with
 * store_strings_free). */
int store_revoke(store_t *s, const char *jti, int64_t exp_s);
int store_revocations(store_t *s, int64_t now_s, char ***jtis, size_t *n);
void store_strings_free(char **v, size_t n);

/* Cluster membership (cluster/membership.h). beat: insert or replace the
 * row of node `id` (1..STORE_ID_MAX bytes, any characters) with the other
 * fields and updated_ms = now_ms; `public_url` 1..STORE_URL_MAX bytes, `admin_url` 0..STORE_URL_MAX
 * ("": the node has no admin listener),
 * `state` "ready" or "draining", counts and capacity (0: not set) >= 0
 * (else -CV_EINVAL). live: the
 * rows with updated_ms >= now_ms - max_age_ms (max_age_ms >= 0), ordered by
 * id, as a heap array of *n rows (NULL when 0) freed with store_nodes_free.
 * Rows are never deleted: a node that stopped beating just ages out. */
int store_node_beat(store_t *s, const char *id, const char *public_url, const char *admin_url,
                    const char *state, int64_t connections, int64_t waiters, int64_t capacity,
                    int64_t now_ms);
int store_nodes_live(store_t *s, int64_t now_ms, int64_t max_age_ms, store_node_t **out, size_t *n);
void store_nodes_free(store_node_t *v);

/* Tell every node on this store `payload` (store/notify.h; at most
 * STORE_NOTIFY_PAYLOAD_MAX bytes): PostgreSQL's NOTIFY on
 * STORE_NOTIFY_CHANNEL. 0 at once on a store no other node shares
 * (SQLite). -CV_EINVAL for a payload too long. */
int store_announce(store_t *s, const char *payload);

/* ---- The shard map of a sharded cluster (PostgreSQL) ----------------------
 * Kept in the control database (migration 8): the instances, each a
 * PostgreSQL URL (a libpq multi-host URL follows a promoted standby), and
 * for each of the SHARD_COUNT logical shards (core/shard.h) the instance
 * that holds its conversations. SQLite: -CV_EINVAL. */

#define STORE_INSTANCES_MAX 64 /* instances of one shard map */
/* The first key of a logical shard's freeze on its instance:
 * pg_advisory_lock(STORE_SHARD_LOCK_KEY, shard), exclusive, held by
 * `converger shards move`; every guarded write takes it shared for its
 * transaction (store_options_t.guard). "CNVS" in ASCII. */
#define STORE_SHARD_LOCK_KEY 1129207379

typedef struct {
  int n;                           /* instances, 1..STORE_INSTANCES_MAX */
  char *urls[STORE_INSTANCES_MAX]; /* heap strings; instance i's URL */
  uint8_t map[256];                /* logical shard -> instance index (SHARD_COUNT) */
  int64_t version;                 /* bumped by every change of the map */
} store_shardmap_t;

/* Read the map into `out` (cleared with store_shardmap_clear).
 * -CV_ENOTFOUND when the database has none (`converger shards init`). */
int store_shardmap_get(store_t *s, store_shardmap_t *out);

/* Write a new map: `urls` (n of them, 1..STORE_INSTANCES_MAX, each at most
 * STORE_URL_MAX bytes) become instances 0..n-1 and logical shard k goes to
 * instance k mod n. -CV_EEXISTS when a map exists already. */
int store_shardmap_init(store_t *s, const char *const *urls, int n);

void store_shardmap_clear(store_shardmap_t *m);

/* A node of a sharded cluster routes by map version `used`: recorded in
 * its membership row (nodes.map_version, migration 9; a node without a
 * row yet records nothing), so that `converger shards move` can wait for
 * every live node to follow a change. *current is the control database's
 * version (0 when there is no map). One statement. Thread: the store's
 * owner. SQLite: -CV_EINVAL. */
int store_shardmap_sync(store_t *s, const char *node, int64_t used, int64_t *current);

/* ---- Presence across nodes (PostgreSQL) -----------------------------------
 * One row per conversation, user (the token's sub), client instance and
 * node holding a connection of it, with since when (wall ms). Each node writes the rows of its own
 * clients and hears the others' through NOTIFY: with store_options_t.notify, the transaction in
 * which a client appears or goes also announces it ("p j ...", "p l ...": store/notify.h). A single
 * node on SQLite keeps presence in its memory (proto/presence.h) and these return -CV_EINVAL there.
 */

typedef struct {
  char user[STORE_ID_MAX + 1];
  int64_t clients;  /* its client instances present */
  int64_t since_ms; /* the earliest of their since, wall ms */
  int64_t rank;     /* its place in user order, from 1 */
} store_member_t;

/* Client `client` of `user` is present in `conv` through node `node`:
 * its row for that node is written (one row per node that holds a
 * connection of the client; nothing when it is there already). *joined is
 * 1 when the client had no row on any node before (then announced, with
 * whether it is `user`'s first client there: *first); a reconnect or a
 * drain move to another node is no join. Ids must be valid. */
int store_presence_join(store_t *s, const char *conv, const char *client, const char *user,
                        const char *node, int64_t since_ms, int *joined, int *first);

/* Client `client` of `user` has no connection in `conv` on node `node`
 * any more (its grace there ended): that node's row goes. *left is 1 when
 * no other node holds a row of the client (then announced, with whether
 * `user` has no other client there: *last); a client that moved to
 * another node stays. */
int store_presence_leave(store_t *s, const char *conv, const char *client, const char *user,
                         const char *node, int *left, int *last);

/* The members of `conv` in user order after `after` ("" for the first
 * page), at most `limit` (0: none, only the count), as a heap array freed
 * with free(); *count is every user present. One snapshot. */
int store_presence_list(store_t *s, const char *conv, const char *after, int limit,
                        store_member_t **out, size_t *n, int64_t *count);

/* Rows of nodes that are gone (their membership row last updated before
 * now_ms - max_age_ms) are deleted, the leave of each client left without
 * a row announced; *removed (may be NULL) counts the rows. Any node may
 * run it: a row goes once. */
int store_presence_sweep(store_t *s, int64_t now_ms, int64_t max_age_ms, int64_t *removed);

/* As store_presence_sweep, for the rows of the nodes named in `nodes` (n
 * of them, valid ids; n 0: nothing): a sharded cluster's instance, whose
 * membership rows are in the control database. */
int store_presence_sweep_nodes(store_t *s, char *const *nodes, size_t n, int64_t *removed);

/* The ids of the nodes whose membership row was last updated before
 * now_ms - max_age_ms: a heap array of heap strings (store_strings_free). */
int store_nodes_gone(store_t *s, int64_t now_ms, int64_t max_age_ms, char ***ids, size_t *n);

/* The rows node `node` holds: parallel heap arrays of conversations,
 * clients and users (free each with store_strings_free), *n of them. A
 * node that restarts reads its rows from before, so a client that
 * reconnects to it within the grace does not leave. */
int store_presence_of_node(store_t *s, const char *node, char ***convs, char ***clients,
                           char ***users, size_t *n);

#endif
