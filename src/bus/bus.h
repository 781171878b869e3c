/*
 * bus: fan-out of committed messages and the subscription index.
 *
 * In-process (one node, SQLite): a pool worker appends through bus_append;
 * under one mutex it commits the message and queues it, so messages reach
 * the loop in commit order. Across nodes on one PostgreSQL (bus_set_remote):
 * the append transaction notifies every node, and each node's listener
 * (bus/pgnotify.h) hands what it hears to bus_publish. In a sharded cluster
 * (bus_set_routed): the appending node queues what it committed as in
 * process, and on the loop hands it to its own subscribers and publishes it
 * to the other nodes through a bus_remote_t (bus/redis.h), which carries it
 * only to the nodes that have a subscriber of its conversation; what they
 * hear goes to bus_heard. Either way, on the loop each message is encoded
 * into its WebSocket frame once and handed to every local subscriber of its
 * conversation (bus_sub_t.deliver), whatever their number. The index and
 * the delivery run on the loop thread only.
 */
#ifndef CONVERGER_BUS_BUS_H
#define CONVERGER_BUS_BUS_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "core/metrics.h"
#include "store/notify.h"
#include "store/pool.h"
#include "store/store.h"

typedef struct bus_s bus_t;

/* What the bus needs from its owner, which installs it at bus_new (the
 * node: proto's frames and its sessions). The bus calls up only through
 * this table. */
typedef struct {
  /* The msg frame JSON of message `m` of `conv`: a heap string the bus
   * frees, NULL when out of memory. Worker threads (the in-process bus
   * builds it inside bus_append) and the loop (a notification heard). */
  char *(*msg_json)(void *ud, const char *conv, const store_msg_t *m);
  /* The bytes on the wire of frame JSON `json` (`len` bytes), built once
   * per message for every subscriber: heap bytes the bus frees, their
   * length in *out_len; NULL when out of memory. Loop thread. */
  char *(*msg_wire)(void *ud, const char *json, size_t len, size_t *out_len);
  /* Channel `channel` was activated (1) or deactivated (0), here or on
   * another node; the bus has recorded it first (bus_channel_*). Loop
   * thread. */
  void (*channel_changed)(void *ud, const char *channel, int active);
  /* A user control another node announced (store/notify.h:
   * NOTIFY_USER_DISCONNECT, NOTIFY_USER_UNSUBSCRIBE). Loop thread. */
  void (*user_control)(void *ud, const notify_t *n);
  /* Presence or a signal another node (or this one, through the store)
   * announced (store/notify.h: NOTIFY_PRESENCE_JOIN, NOTIFY_PRESENCE_LEAVE,
   * NOTIFY_SIGNAL), for a conversation with a subscriber here. Loop
   * thread. */
  void (*ephemeral)(void *ud, const notify_t *n);
  void *ud;
} bus_handler_t;

/* One committed message, shared by every subscriber that holds it
 * (reference counted, loop thread). A message without `json` (and so
 * without `frame`) is a head hint: "this conversation has messages up to
 * `seq`; read those you lack from the store". Listeners publish hints for
 * messages too large for a notification, and after an outage. */
typedef struct bus_msg_s {
  struct bus_msg_s *next; /* worker -> loop queue */
  int refs;
  int64_t seq;
  char conv[STORE_ID_MAX + 1];
  char epoch[STORE_EPOCH_MAX + 1]; /* its conversation's epoch when committed; "" unknown */
  char *json;                      /* msg frame JSON (built on the worker) */
  char *frame;                     /* encoded WebSocket frame, built once on the loop */
  size_t frame_len;
  int64_t ts_ms; /* wall ms of its commit (converger_delivery_latency_ms); 0: unknown */
  int remote; /* BUS_PATH_*: how it came (converger_delivery_latency_ms{path}) */
  char *payload; /* routed: its store/notify.h payload, published after the commit; NULL none */
} bus_msg_t;

#define BUS_PATH_LOCAL  0 /* this node's commit, in process */
#define BUS_PATH_NOTIFY 1 /* heard through PostgreSQL's NOTIFY (bus/pgnotify.h) */
#define BUS_PATH_BUS    2 /* heard on a sharded cluster's bus (bus/redis.h) */

typedef struct bus_sub_s bus_sub_t;
/* Called on the loop for each message of the subscribed conversation. The
 * callee takes a reference (bus_msg_ref) if it keeps `msg`. */
typedef void (*bus_deliver_cb)(bus_sub_t *sub, bus_msg_t *msg);

/* Embedded in a subscriber; `conv` must stay valid while subscribed. */
struct bus_sub_s {
  bus_sub_t *next, *prev;
  const char *conv;
  bus_deliver_cb deliver;
  int linked;
};

/* Create the bus on `loop` with its owner's handler (copied; every
 * function required); it counts in `metrics` (borrowed, may be NULL; it
 * must outlive the bus). NULL on failure. Loop thread. */
bus_t *bus_new(uv_loop_t *loop, const bus_handler_t *handler, metrics_t *metrics);

/* A channel's state changed (a REST PATCH here, or heard from another
 * node): record it, then tell the owner (handler.channel_changed). Loop
 * thread. */
void bus_channel_changed(bus_t *bus, const char *channel, int active);

/* The channel changes recorded so far: a generation for
 * bus_channel_changed_since and bus_channel_last_change_since. */
uint64_t bus_channel_gen(const bus_t *bus);

/* A user control heard from another node: to the owner
 * (handler.user_control). Loop thread. */
void bus_user_control(bus_t *bus, const notify_t *n);

/* Presence or a signal heard (handler.ephemeral). Loop thread. */
void bus_ephemeral(bus_t *bus, const notify_t *n);

/* Call `fn(sub, ud)` for every local subscriber of `conv` (`fn` must not
 * subscribe or unsubscribe). Loop thread. */
void bus_each(bus_t *bus, const char *conv, void (*fn)(bus_sub_t *sub, void *ud), void *ud);

/* 1 when `channel` changed state after generation `gen` (or too many
 * changes came since to tell): a state read from the store before is out
 * of date. */
int bus_channel_changed_since(const bus_t *bus, uint64_t gen, const char *channel);

/* The last change of `channel` since `gen`: 1 activated, 0 deactivated,
 * -1 none remembered. */
int bus_channel_last_change_since(const bus_t *bus, uint64_t gen, const char *channel);
/* Close the async handle; the bus is freed in its close callback.
 * Subscribers must be gone. */
void bus_close(bus_t *bus);

/* Index (loop thread). Subscribing twice or unsubscribing an unlinked sub
 * is a no-op. */
void bus_subscribe(bus_t *bus, bus_sub_t *sub);
void bus_unsubscribe(bus_t *bus, bus_sub_t *sub);

size_t bus_count(const bus_t *bus);

/* Worker thread: store_append, and when a new message was created queue it
 * for fan-out, both under the bus's append mutex (commit order = delivery
 * order); after bus_set_remote, store_append alone. Same arguments and
 * results as store_append. */
int bus_append(bus_t *bus, store_t *db, const char *conv, const char *id, const char *sender,
               const char *body, int64_t ts_ms, store_msg_t *out, int *created);

/* Worker thread: bus_append for `n` appends at once, committed together
 * (store_append_batch, a group commit), and the new ones queued for
 * fan-out in commit order. Returns as store_append_batch; each item's
 * status is its own. */
int bus_append_batch(bus_t *bus, store_t *db, store_append_t *const *items, size_t n);

/* An append on its way through the group commit: embed it in the job of
 * its owner (a REST request, a `send` frame), fill `a`'s conv, id, sender
 * and body (borrowed: they must live until `done`), and submit it with
 * bus_append_submit. Its timestamp is the batch's time on the worker. */
typedef struct {
  pool_job_t job;
  bus_t *bus;
  store_append_t a; /* in `done`: a.status, a.created, a.msg (the owner clears it) */
} bus_append_job_t;

/* Queue `j` on `pool` for the group commit (pool_submit_batch): the appends
 * queued together are committed in one transaction by bus_append_batch,
 * then `done` runs for each on the loop, where pool_job_unrun(&j->job)
 * says whether it ran at all. Loop thread. */
void bus_append_submit(bus_t *bus, pool_t *pool, bus_append_job_t *j, pool_done_cb done);

/* The msg frame JSON of `m` (the handler's msg_json): heap, NULL on OOM.
 * Any thread. */
char *bus_msg_json(bus_t *bus, const char *conv, const store_msg_t *m);

void bus_msg_ref(bus_msg_t *m);
void bus_msg_unref(bus_msg_t *m);

/* A new message with one reference, taking ownership of `json` (the msg
 * frame JSON; NULL for a head hint). NULL when out of memory (`json` is
 * freed). Any thread. */
bus_msg_t *bus_msg_new(const char *conv, int64_t seq, char *json);

/* Fan `m` out to the local subscribers of its conversation (its frame
 * encoded once, here) and drop the caller's reference. With subscribers
 * and a commit time, observes converger_delivery_latency_ms{path} ("local":
 * the in-process bus; "notify": through PostgreSQL's NOTIFY): from the
 * commit to the frames queued for the sockets, which are written at the
 * end of this loop turn. A commit of another node compares two hosts'
 * wall clocks. Loop thread. */
void bus_publish(bus_t *bus, bus_msg_t *m);

/* Whether conversation `conv` has a subscriber on this node, so that a
 * message heard from another node can be dropped before it is copied.
 * Loop thread. */
int bus_has_sub(const bus_t *bus, const char *conv);

/* Fan-out comes from a listener from now on (bus/pgnotify.h): bus_append
 * only commits (the store notifies) and queues nothing. Call before the
 * pool runs appends. */
void bus_set_remote(bus_t *bus);

/* What a sharded cluster's bus (bus/redis.h) does for the bus, installed
 * with bus_set_routed. Loop thread. */
typedef struct {
  /* Send store/notify.h payload `payload` to the other nodes that have a
   * subscriber of conversation `conv`, or to every node when `conv` is
   * NULL (channel changes and user controls). */
  void (*publish)(void *ud, const char *conv, const char *payload);
  /* Conversation `conv` has its first local subscriber (on 1), or lost
   * its last (on 0). */
  void (*interest)(void *ud, const char *conv, int on);
  void *ud;
} bus_remote_t;

/* A sharded cluster: fan-out to other nodes through `remote` (copied).
 * bus_append queues what it commits for this node's subscribers, and the
 * loop then publishes it (also a message found by an idempotent retry: the
 * first attempt's publish may have been lost); bus_announce's payloads are
 * heard here and published. `node_id` (copied): this node's, whose own
 * user controls are not acted on twice. Call before the pool runs
 * appends. */
void bus_set_routed(bus_t *bus, const bus_remote_t *remote, const char *node_id);

/* The registry the bus counts in (bus_new's; may be NULL), for the
 * modules that feed it (bus/pgnotify.c, bus/redis.c). */
metrics_t *bus_metrics(const bus_t *bus);

/* A sharded cluster's store (borrowed; the node's): bus_append_submit
 * batches the appends of each instance apart (pool_job_t.batch_key), so
 * that an instance that hangs holds its own group commit only, and the
 * instances commit in parallel. Loop thread, before appends. */
void bus_set_shards(bus_t *bus, store_shards_t *shards);

/* 1 after bus_set_routed. */
int bus_routed(const bus_t *bus);

/* A payload to announce to every node (a store_announce_cb, store.h):
 * copied and queued for the loop, which hears it here (bus_heard) and
 * publishes it (bus_remote_t.publish). Any thread. */
void bus_announce(void *bus, const char *payload);

/* A payload of store/notify.h heard from another node: messages and head
 * hints to bus_publish (only when the conversation has a subscriber
 * here), channel changes to bus_channel_changed, user controls of another
 * origin than `node_id` (this node's own were acted on where they were
 * asked) to bus_user_control, presence and signals to bus_ephemeral. A
 * group payload ("b") is split. `path` is BUS_PATH_NOTIFY or BUS_PATH_BUS.
 * Loop thread. */
void bus_heard(bus_t *bus, const char *payload, const char *node_id, int path);

/* The distinct conversations with a local subscriber, as a heap array of
 * heap strings (free with store_strings_free). 0 or -CV_ENOMEM. Loop
 * thread. */
int bus_convs(const bus_t *bus, char ***convs, size_t *n);

#endif
