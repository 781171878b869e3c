/*
 * redis.c: a sharded cluster's bus on Redis pub/sub (see redis.h).
 *
 * Per instance, two hiredis connections: `sub` in subscribe mode (the
 * channels this node listens to) and `pub` (PUBLISH, and the PING that
 * tells a hung server from an idle one: hiredis 0.14 passes no PING answer
 * up from a connection in subscribe mode). An instance is up once both are
 * connected; it goes down when either fails, and the tick (every TICK_MS)
 * frees both and tries again after REDIS_BUS_RETRY_MS. hiredis callbacks
 * never free a context: they mark the instance `broken`, and the tick
 * does it. Until then the instance still says `up`, but a disconnect
 * callback may have forgotten its context already (hiredis frees it after
 * the callback): nothing is sent to a broken instance (can_send).
 *
 * Interest: `interest` is a hash table of the conversations with a local
 * subscriber (entry: its instance, whether Redis confirmed the
 * subscription, when something was last heard). Each instance has an
 * ordered queue of SUBSCRIBE and UNSUBSCRIBE operations, sent by a check
 * handle once per loop turn, runs of one kind in batches of
 * REDIS_BUS_BATCH (the order matters: subscribe, unsubscribe, subscribe
 * again must end subscribed).
 *
 * Heads checks (bus/heads.h): conversations waiting for one are in
 * `due`; the tick submits at most one check at a time, of at most
 * REDIS_BUS_CHECK_MAX of them. Those the store could not read wait in
 * `retry` for the next poll period.
 */
#include "bus/redis.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/rand.h>

#include <hiredis/adapters/libuv.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "bus/heads.h"
#include "common/util.h"
#include "core/busurl.h"
#include "core/errors.h"
#include "core/log.h"
#include "core/shard.h"
#include "store/store.h"

#define TICK_MS          50
#define INTEREST_BUCKETS 65536
#define CONV_PREFIX      "cvg.m."
#define CONTROL_CHANNEL  "cvg.c"
#define SEEN_MAX         256 /* control messages remembered, to drop the copies */
#define TAG_LEN          12  /* hex digits of a node's origin tag: 48 random bits */

typedef struct interest_s {
  struct interest_s *next;
  int inst;
  int live;            /* Redis confirmed the SUBSCRIBE since the connection came up */
  int due;             /* in rb->due, waiting for a heads check */
  uint64_t last_heard; /* monotonic ms: something heard, or a check queued */
  char conv[];
} interest_t;

typedef struct {
  char *conv;
  int on; /* 1 SUBSCRIBE, 0 UNSUBSCRIBE */
} op_t;

typedef struct {
  char **v;
  size_t n, cap;
} strvec_t;

/* A publish that could not go out (the instance's connections down or
 * broken, too many awaiting their answer): sent when the instance is up
 * again. */
typedef struct {
  char *channel, *msg;
  size_t len;
} unsent_t;

typedef struct {
  redis_bus_t *rb;
  int index;
  char host[BUSURL_HOST_MAX + 1];
  int port;
  char shown[BUSURL_HOST_MAX + 20];
  redisAsyncContext *sub, *pub;
  int sub_connected, pub_connected;
  int up;            /* both connected, the channels subscribed again */
  int broken;        /* a callback saw a failure: the tick takes it down */
  uint64_t began;    /* monotonic ms the connections began; 0: none */
  uint64_t retry_at; /* no connection: next attempt */
  uint64_t ping_due, ping_sent;
  int ping_out;
  int publishes_out;
  int failures;
  size_t nlive;                          /* confirmed subscriptions (converger_bus_subscriptions) */
  unsent_t unsent[REDIS_BUS_UNSENT_MAX]; /* a ring: the oldest go when it is full */
  size_t unsent_head, nunsent;
  op_t *ops;
  size_t nops, ops_cap;
} inst_t;

struct redis_bus_s {
  uv_loop_t *loop;
  bus_t *bus;
  pool_t *const *pool;
  metrics_t *metrics;
  char node_id[STORE_ID_MAX + 1];
  char tag[TAG_LEN + 1]; /* this process's origin tag on the bus (random) */
  int check_ms;
  int n;
  inst_t inst[REDIS_BUS_MAX];
  uv_timer_t timer;
  uv_check_t flush;
  int handles_open;
  int closing;
  uint64_t serial; /* of this node's messages */
  uint64_t next_poll, next_idle;
  int checking; /* a heads check is in the pool */
  strvec_t due, retry;
  size_t idle_cursor;      /* bucket where the next idle check starts */
  uint64_t seen[SEEN_MAX]; /* hashes of control messages heard */
  size_t seen_next;
  interest_t *buckets[INTEREST_BUCKETS];
};

/* ---- small helpers --------------------------------------------------------- */

static int vec_push(strvec_t *v, const char *s) {
  if (v->n == v->cap) {
    size_t cap = v->cap ? 2 * v->cap : 64;
    char **w = realloc(v->v, cap * sizeof *w);
    if (!w) return -CV_ENOMEM;
    v->v = w;
    v->cap = cap;
  }
  if (!(v->v[v->n] = strdup(s))) return -CV_ENOMEM;
  v->n++;
  return 0;
}

static void vec_clear(strvec_t *v) {
  store_strings_free(v->v, v->n);
  memset(v, 0, sizeof *v);
}

static size_t bucket_of(const char *conv) { return (size_t)(shard_key(conv) % INTEREST_BUCKETS); }

static interest_t *find(redis_bus_t *rb, const char *conv) {
  for (interest_t *e = rb->buckets[bucket_of(conv)]; e; e = e->next)
    if (strcmp(e->conv, conv) == 0) return e;
  return NULL;
}

static void gauge_subs(inst_t *ri) {
  char labels[32];
  snprintf(labels, sizeof labels, "bus_instance=\"%d\"", ri->index);
  metrics_set(ri->rb->metrics, "converger_bus_subscriptions", labels, (double)ri->nlive);
}

static void gauge_up(inst_t *ri) {
  char labels[32];
  snprintf(labels, sizeof labels, "bus_instance=\"%d\"", ri->index);
  metrics_set(ri->rb->metrics, "converger_bus_up", labels, ri->up ? 1 : 0);
}

static void count_polls(redis_bus_t *rb, const char *reason, size_t n) {
  char labels[32];
  snprintf(labels, sizeof labels, "reason=\"%s\"", reason);
  if (n) metrics_add(rb->metrics, "converger_bus_head_polls_total", labels, n);
}

/* A conversation wants a heads check (`reason` for the metric). */
static void want_check(redis_bus_t *rb, interest_t *e, const char *reason) {
  e->last_heard = util_mono_ms();
  if (e->due) return;
  if (vec_push(&rb->due, e->conv) == 0) {
    e->due = 1;
    count_polls(rb, reason, 1);
  }
}

static int queue_op(inst_t *ri, const char *conv, int on) {
  if (ri->nops == ri->ops_cap) {
    size_t cap = ri->ops_cap ? 2 * ri->ops_cap : 64;
    op_t *w = realloc(ri->ops, cap * sizeof *w);
    if (!w) return -CV_ENOMEM;
    ri->ops = w;
    ri->ops_cap = cap;
  }
  if (!(ri->ops[ri->nops].conv = strdup(conv))) return -CV_ENOMEM;
  ri->ops[ri->nops++].on = on;
  return 0;
}

static void ops_clear(inst_t *ri) {
  for (size_t i = 0; i < ri->nops; i++) free(ri->ops[i].conv);
  ri->nops = 0;
}

/* ---- a message on a conversation's channel -------------------------------- */

/* A message's payload, "m SEQ CONV ...", names its conversation, which
 * the channel names already: on a conversation's channel it goes as
 * "m SEQ . ..." (a third of the bytes the bus adds to a 300-byte message),
 * and unfold() puts the conversation back. Other payloads go as they are.
 * Returns the start of the part after CONV in `payload`, and the length
 * of the part before it in *head; NULL when it is not such a payload. */
static const char *fold_point(const char *payload, const char *conv, size_t *head) {
  if (strncmp(payload, "m ", 2) != 0) return NULL;
  const char *seq_end = strchr(payload + 2, ' ');
  size_t clen = strlen(conv);
  if (!seq_end || strncmp(seq_end + 1, conv, clen) != 0) return NULL;
  const char *after = seq_end + 1 + clen;
  if (*after != ' ' && *after != '\n' && *after != '\0') return NULL;
  *head = (size_t)(seq_end + 1 - payload);
  return after;
}

/* The payload heard on conversation `conv`'s channel as store/notify.h
 * has it (a heap string), or NULL when out of memory. */
static char *unfold(const char *data, size_t len, const char *conv) {
  if (len >= 4 && strncmp(data, "m ", 2) == 0) {
    const char *seq_end = memchr(data + 2, ' ', len - 2);
    if (seq_end && (size_t)(seq_end + 2 - data) <= len && seq_end[1] == '.' &&
        (seq_end + 2 == data + len || seq_end[2] == ' ' || seq_end[2] == '\n')) {
      size_t head = (size_t)(seq_end + 1 - data), clen = strlen(conv);
      size_t tail = len - head - 1;
      char *out = malloc(head + clen + tail + 1);
      if (!out) return NULL;
      memcpy(out, data, head);
      memcpy(out + head, conv, clen);
      memcpy(out + head + clen, seq_end + 2, tail);
      out[head + clen + tail] = '\0';
      return out;
    }
  }
  return strndup(data, len);
}

/* ---- what is heard --------------------------------------------------------- */

/* Control messages come once from each instance: the first one counts. */
static int seen_before(redis_bus_t *rb, const char *origin_serial, size_t len) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)origin_serial[i]) * 1099511628211ull;
  for (size_t i = 0; i < SEEN_MAX; i++)
    if (rb->seen[i] == h) return 1;
  rb->seen[rb->seen_next] = h;
  rb->seen_next = (rb->seen_next + 1) % SEEN_MAX;
  return 0;
}

/* Digits of `n` in decimal. */
static size_t digits(size_t n) {
  size_t d = 1;
  while (n >= 10) n /= 10, d++;
  return d;
}

static void heard_message(inst_t *ri, const char *channel, const char *data, size_t len) {
  redis_bus_t *rb = ri->rb;
  char labels[32];
  snprintf(labels, sizeof labels, "bus_instance=\"%d\"", ri->index);
  /* the whole RESP push, as it came over the socket:
   * *3\r\n$7\r\nmessage\r\n$N\r\nCHANNEL\r\n$N\r\nDATA\r\n */
  size_t chlen = strlen(channel);
  size_t wire = 17 + 1 + digits(chlen) + 2 + chlen + 2 + 1 + digits(len) + 2 + len + 2;
  metrics_add(rb->metrics, "converger_bus_messages_in_total", labels, 1);
  metrics_add(rb->metrics, "converger_bus_bytes_in_total", labels, wire);
  const char *nl = memchr(data, '\n', len);
  if (!nl || memchr(data, '\0', len)) {
    log_warn("bus: ignoring a message on %s that is not converger's", channel);
    return;
  }
  const char *sp = memchr(data, ' ', (size_t)(nl - data));
  size_t olen = (size_t)((sp ? sp : nl) - data);
  if (olen == TAG_LEN && memcmp(data, rb->tag, TAG_LEN) == 0) return; /* our own */
  int control = strcmp(channel, CONTROL_CHANNEL) == 0;
  if (control && seen_before(rb, data, (size_t)(nl - data))) return;
  int of_conv = !control && strncmp(channel, CONV_PREFIX, strlen(CONV_PREFIX)) == 0;
  size_t plen = len - (size_t)(nl + 1 - data);
  char *payload =
      of_conv ? unfold(nl + 1, plen, channel + strlen(CONV_PREFIX)) : strndup(nl + 1, plen);
  if (!payload) {
    log_error("bus: out of memory for a message on %s; its subscribers read it from the store",
              channel);
    return;
  }
  if (of_conv) {
    interest_t *e = find(rb, channel + strlen(CONV_PREFIX));
    if (e) e->last_heard = util_mono_ms();
  }
  bus_heard(rb->bus, payload, rb->node_id, BUS_PATH_BUS);
  free(payload);
}

/* Every reply on the subscribe connection: confirmations of SUBSCRIBE and
 * UNSUBSCRIBE, and the messages. NULL: the connection is being freed. */
static void sub_reply(redisAsyncContext *ac, void *r, void *privdata) {
  redisReply *reply = r;
  inst_t *ri = privdata;
  if (!reply || !ri || ri->rb->closing || ac != ri->sub) return;
  if (reply->type == REDIS_REPLY_ERROR) {
    log_warn("bus: %s refused a subscription: %s", ri->shown, reply->str);
    ri->broken = 1;
    return;
  }
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 3 ||
      reply->element[0]->type != REDIS_REPLY_STRING ||
      reply->element[1]->type != REDIS_REPLY_STRING)
    return;
  const char *kind = reply->element[0]->str, *channel = reply->element[1]->str;
  if (strcmp(kind, "message") == 0 && reply->element[2]->type == REDIS_REPLY_STRING) {
    heard_message(ri, channel, reply->element[2]->str, reply->element[2]->len);
  } else if (strcmp(kind, "subscribe") == 0 &&
             strncmp(channel, CONV_PREFIX, strlen(CONV_PREFIX)) == 0) {
    interest_t *e = find(ri->rb, channel + strlen(CONV_PREFIX));
    if (e && e->inst == ri->index && !e->live) {
      e->live = 1;
      ri->nlive++;
      gauge_subs(ri);
      /* what was committed before this took effect is read from the store */
      want_check(ri->rb, e, "subscribed");
    }
  } else if (strcmp(kind, "unsubscribe") == 0 &&
             strncmp(channel, CONV_PREFIX, strlen(CONV_PREFIX)) == 0) {
    /* Interest that came back while the UNSUBSCRIBE was on its way: the
     * SUBSCRIBE queued after it is confirmed next, and then the head is
     * read again (what was published between the two was missed). */
    interest_t *e = find(ri->rb, channel + strlen(CONV_PREFIX));
    if (e && e->inst == ri->index && e->live) {
      e->live = 0;
      ri->nlive--;
      gauge_subs(ri);
    }
  }
}

static void pub_reply(redisAsyncContext *ac, void *r, void *privdata) {
  redisReply *reply = r;
  inst_t *ri = privdata;
  if (!reply || !ri || ri->rb->closing || ac != ri->pub) return;
  if (ri->publishes_out > 0) ri->publishes_out--;
  if (reply->type == REDIS_REPLY_ERROR) {
    log_warn("bus: %s refused a publish: %s", ri->shown, reply->str);
    ri->broken = 1;
  }
}

static void ping_reply(redisAsyncContext *ac, void *r, void *privdata) {
  redisReply *reply = r;
  inst_t *ri = privdata;
  if (!reply || !ri || ri->rb->closing || ac != ri->pub) return;
  ri->ping_out = 0;
  if (reply->type == REDIS_REPLY_ERROR) ri->broken = 1;
}

/* ---- connections ----------------------------------------------------------- */

static void on_connect(const redisAsyncContext *ac, int status) {
  inst_t *ri = ac->data;
  if (!ri) return;
  if (status != REDIS_OK) { /* hiredis frees the context after this */
    if (ac == ri->sub) ri->sub = NULL;
    if (ac == ri->pub) ri->pub = NULL;
    ri->broken = 1;
    return;
  }
  if (ac == ri->sub) ri->sub_connected = 1;
  if (ac == ri->pub) ri->pub_connected = 1;
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
  inst_t *ri = ac->data;
  if (!ri) return;
  if (ac == ri->sub) ri->sub = NULL;
  if (ac == ri->pub) ri->pub = NULL;
  ri->broken = 1;
}

static redisAsyncContext *open_one(inst_t *ri) {
  redisAsyncContext *ac = redisAsyncConnect(ri->host, ri->port);
  if (!ac) return NULL;
  if (ac->err || redisLibuvAttach(ac, ri->rb->loop) != REDIS_OK) {
    redisAsyncFree(ac);
    return NULL;
  }
  ac->data = ri;
  redisAsyncSetConnectCallback(ac, on_connect);
  redisAsyncSetDisconnectCallback(ac, on_disconnect);
  return ac;
}

/* Free a context we hold (never from inside one of its callbacks). */
static void drop_ctx(redisAsyncContext **acp) {
  redisAsyncContext *ac = *acp;
  if (!ac) return;
  *acp = NULL;
  ac->data = NULL; /* its callbacks, run by the free, find no instance */
  redisAsyncFree(ac);
}

static void inst_down(inst_t *ri, const char *why) {
  redis_bus_t *rb = ri->rb;
  int was_up = ri->up;
  drop_ctx(&ri->sub);
  drop_ctx(&ri->pub);
  ri->sub_connected = ri->pub_connected = 0;
  ri->up = 0;
  ri->broken = 0;
  ri->began = 0;
  ri->ping_out = 0;
  ri->publishes_out = 0;
  ri->retry_at = util_mono_ms() + REDIS_BUS_RETRY_MS;
  ops_clear(ri);
  for (size_t b = 0; b < INTEREST_BUCKETS; b++)
    for (interest_t *e = rb->buckets[b]; e; e = e->next)
      if (e->inst == ri->index) e->live = 0;
  ri->nlive = 0;
  gauge_subs(ri);
  gauge_up(ri);
  if (was_up)
    log_warn("bus: instance %d (%s) lost (%s); its conversations' heads are read from the store "
             "every %d ms until it is back",
             ri->index, ri->shown, why, REDIS_BUS_POLL_MS);
  else if (ri->failures++ == 0 || ri->failures % 20 == 0)
    log_warn("bus: cannot reach instance %d (%s): %s; retrying every %d ms", ri->index, ri->shown,
             why, REDIS_BUS_RETRY_MS);
}

static void inst_connect(inst_t *ri) {
  ri->began = util_mono_ms();
  ri->sub = open_one(ri);
  ri->pub = ri->sub ? open_one(ri) : NULL;
  if (!ri->sub || !ri->pub) inst_down(ri, "cannot open a connection");
}

/* Both connections work: listen to the control channel and to every
 * conversation of the instance again (confirmations bring heads checks). */
static void unsent_free(unsent_t *u) {
  free(u->channel);
  free(u->msg);
  memset(u, 0, sizeof *u);
}

/* Keep a publish that cannot go out now for inst_up; past
 * REDIS_BUS_UNSENT_MAX the oldest is dropped (its conversation's next
 * message or the idle check repairs it). */
static void keep_unsent(inst_t *ri, const char *channel, const char *msg, size_t len) {
  if (ri->nunsent == REDIS_BUS_UNSENT_MAX) {
    unsent_free(&ri->unsent[ri->unsent_head]);
    ri->unsent_head = (ri->unsent_head + 1) % REDIS_BUS_UNSENT_MAX;
    ri->nunsent--;
  }
  unsent_t *u = &ri->unsent[(ri->unsent_head + ri->nunsent) % REDIS_BUS_UNSENT_MAX];
  u->channel = strdup(channel);
  u->msg = malloc(len);
  if (!u->channel || !u->msg) {
    unsent_free(u);
    return;
  }
  memcpy(u->msg, msg, len);
  u->len = len;
  ri->nunsent++;
}

static void publish_on(inst_t *ri, const char *channel, const char *msg, size_t len);

static void inst_up(inst_t *ri) {
  redis_bus_t *rb = ri->rb;
  ri->up = 1;
  ri->failures = 0;
  ri->ping_due = util_mono_ms() + REDIS_BUS_PING_EVERY_MS;
  const char *argv[] = {"SUBSCRIBE", CONTROL_CHANNEL};
  if (redisAsyncCommandArgv(ri->sub, sub_reply, ri, 2, argv, NULL) != REDIS_OK) {
    ri->broken = 1;
    return;
  }
  size_t k = 0;
  for (size_t b = 0; b < INTEREST_BUCKETS; b++)
    for (interest_t *e = rb->buckets[b]; e; e = e->next)
      if (e->inst == ri->index && queue_op(ri, e->conv, 1) == 0) k++;
  gauge_up(ri);
  size_t kept = ri->nunsent;
  log_info("bus: instance %d (%s) up; subscribing %zu conversation(s), publishing %zu kept",
           ri->index, ri->shown, k, kept);
  while (ri->nunsent > 0 && !ri->broken) {
    unsent_t u = ri->unsent[ri->unsent_head];
    memset(&ri->unsent[ri->unsent_head], 0, sizeof u);
    ri->unsent_head = (ri->unsent_head + 1) % REDIS_BUS_UNSENT_MAX;
    ri->nunsent--;
    publish_on(ri, u.channel, u.msg, u.len);
    unsent_free(&u);
  }
}

/* ---- the bus_remote_t ------------------------------------------------------ */

static int inst_of(const redis_bus_t *rb, const char *conv) {
  return shard_jump(shard_key(conv), rb->n);
}

/* Whether a command may go on `ac` of `ri`: up, not broken (a callback saw
 * a failure and the tick has not taken the instance down yet), and the
 * context still there (on_disconnect and on_connect forget it). */
static int can_send(const inst_t *ri, const redisAsyncContext *ac) {
  return ri->up && !ri->broken && ac != NULL;
}

static void publish_on(inst_t *ri, const char *channel, const char *msg, size_t len) {
  if (!can_send(ri, ri->pub) || ri->publishes_out >= REDIS_BUS_PUBLISH_MAX) {
    /* The subscribers' own connections to the instance may be fine, and
     * then nothing else tells them: sent once it is up again. */
    keep_unsent(ri, channel, msg, len);
    return;
  }
  const char *argv[] = {"PUBLISH", channel, msg};
  size_t lens[] = {7, strlen(channel), len};
  if (redisAsyncCommandArgv(ri->pub, pub_reply, ri, 3, argv, lens) != REDIS_OK) {
    ri->broken = 1;
    return;
  }
  ri->publishes_out++;
  char labels[32];
  snprintf(labels, sizeof labels, "bus_instance=\"%d\"", ri->index);
  metrics_add(ri->rb->metrics, "converger_bus_bytes_out_total", labels, len);
}

static void remote_publish(void *ud, const char *conv, const char *payload) {
  redis_bus_t *rb = ud;
  char *msg = NULL;
  /* a conversation's channel: "TAG\nPAYLOAD"; the control channel, which
   * every instance carries: "TAG SERIAL\nPAYLOAD", the serial telling the
   * copies of one message from another message */
  size_t head = 0;
  const char *after = conv ? fold_point(payload, conv, &head) : NULL;
  int len = after  ? asprintf(&msg, "%s\n%.*s.%s", rb->tag, (int)head, payload, after)
            : conv ? asprintf(&msg, "%s\n%s", rb->tag, payload)
                   : asprintf(&msg, "%s %" PRIu64 "\n%s", rb->tag, ++rb->serial, payload);
  if (len < 0) {
    log_error("bus: out of memory publishing; subscribers elsewhere read it from the store");
    return;
  }
  if (!conv) {
    for (int i = 0; i < rb->n; i++) publish_on(&rb->inst[i], CONTROL_CHANNEL, msg, (size_t)len);
  } else {
    char channel[sizeof CONV_PREFIX + STORE_ID_MAX];
    snprintf(channel, sizeof channel, CONV_PREFIX "%s", conv);
    publish_on(&rb->inst[inst_of(rb, conv)], channel, msg, (size_t)len);
  }
  free(msg);
}

static void remote_interest(void *ud, const char *conv, int on) {
  redis_bus_t *rb = ud;
  interest_t **link = &rb->buckets[bucket_of(conv)];
  while (*link && strcmp((*link)->conv, conv) != 0) link = &(*link)->next;
  inst_t *ri = &rb->inst[inst_of(rb, conv)];
  if (on) {
    if (*link) return;
    interest_t *e = calloc(1, sizeof *e + strlen(conv) + 1);
    if (!e) {
      log_error("bus: out of memory subscribing to %s; it is read from the store", conv);
      return;
    }
    strcpy(e->conv, conv);
    e->inst = ri->index;
    e->last_heard = util_mono_ms();
    e->next = rb->buckets[bucket_of(conv)];
    rb->buckets[bucket_of(conv)] = e;
    if (ri->up) (void)queue_op(ri, conv, 1);
    return;
  }
  interest_t *e = *link;
  if (!e) return;
  *link = e->next;
  if (e->live) {
    ri->nlive--;
    gauge_subs(ri);
  }
  if (ri->up) (void)queue_op(ri, conv, 0);
  free(e);
}

/* ---- the loop's work --------------------------------------------------------- */

/* Send each instance's queued operations, runs of one kind together. */
static void flush_cb(uv_check_t *h) {
  redis_bus_t *rb = h->data;
  for (int i = 0; i < rb->n; i++) {
    inst_t *ri = &rb->inst[i];
    if (!can_send(ri, ri->sub) || ri->nops == 0) continue; /* broken: inst_down clears them */
    const char *argv[REDIS_BUS_BATCH + 1];
    char *chans[REDIS_BUS_BATCH];
    size_t k = 0;
    while (k < ri->nops && !ri->broken) {
      int on = ri->ops[k].on;
      int argc = 1;
      argv[0] = on ? "SUBSCRIBE" : "UNSUBSCRIBE";
      while (k < ri->nops && ri->ops[k].on == on && argc <= REDIS_BUS_BATCH) {
        char *c = NULL;
        if (asprintf(&c, CONV_PREFIX "%s", ri->ops[k].conv) >= 0) {
          chans[argc - 1] = c;
          argv[argc++] = c;
        }
        k++;
      }
      if (argc > 1 && redisAsyncCommandArgv(ri->sub, sub_reply, ri, argc, argv, NULL) != REDIS_OK)
        ri->broken = 1;
      for (int a = 1; a < argc; a++) free(chans[a - 1]);
    }
    ops_clear(ri);
  }
}

static void check_done(void *ud, int canceled, char **failed, size_t nfailed, size_t n,
                       size_t inactive) {
  redis_bus_t *rb = ud;
  rb->checking = 0;
  for (size_t i = 0; i < nfailed && !canceled && !rb->closing; i++)
    if (find(rb, failed[i])) (void)vec_push(&rb->retry, failed[i]);
  store_strings_free(failed, nfailed);
}

/* Submit the next heads check, when none runs. */
static void start_check(redis_bus_t *rb) {
  if (rb->checking || rb->due.n == 0 || !*rb->pool) return;
  size_t n = rb->due.n < REDIS_BUS_CHECK_MAX ? rb->due.n : REDIS_BUS_CHECK_MAX;
  char **convs = malloc(n * sizeof *convs);
  if (!convs) return;
  memcpy(convs, rb->due.v, n * sizeof *convs);
  for (size_t i = 0; i < n; i++) {
    interest_t *e = find(rb, convs[i]);
    if (e) e->due = 0;
  }
  memmove(rb->due.v, rb->due.v + n, (rb->due.n - n) * sizeof *convs);
  rb->due.n -= n;
  if (heads_check(rb->bus, *rb->pool, convs, n, 0, check_done, rb) == 0) rb->checking = 1;
}

static void tick_cb(uv_timer_t *t) {
  redis_bus_t *rb = t->data;
  uint64_t now = util_mono_ms();
  for (int i = 0; i < rb->n; i++) {
    inst_t *ri = &rb->inst[i];
    if (ri->broken) {
      inst_down(ri, "connection failed");
    } else if (!ri->sub && !ri->pub) {
      if (now >= ri->retry_at) inst_connect(ri);
    } else if (!ri->up) {
      if (ri->sub_connected && ri->pub_connected)
        inst_up(ri);
      else if (now - ri->began > REDIS_BUS_CONNECT_MS)
        inst_down(ri, "no connection in time");
    } else if (ri->ping_out && now - ri->ping_sent > REDIS_BUS_PING_TIMEOUT_MS) {
      inst_down(ri, "no answer to a PING in time");
    } else if (!ri->ping_out && now >= ri->ping_due) {
      ri->ping_due = now + REDIS_BUS_PING_EVERY_MS;
      ri->ping_sent = now;
      const char *argv[] = {"PING"};
      if (redisAsyncCommandArgv(ri->pub, ping_reply, ri, 1, argv, NULL) != REDIS_OK)
        ri->broken = 1;
      else
        ri->ping_out = 1;
    }
  }
  if (now >= rb->next_poll) { /* down instances' conversations, and the checks that failed */
    rb->next_poll = now + REDIS_BUS_POLL_MS;
    for (size_t i = 0; i < rb->retry.n; i++) (void)vec_push(&rb->due, rb->retry.v[i]);
    count_polls(rb, "retry", rb->retry.n);
    vec_clear(&rb->retry);
    for (size_t b = 0; b < INTEREST_BUCKETS; b++)
      for (interest_t *e = rb->buckets[b]; e; e = e->next)
        if (!rb->inst[e->inst].up) want_check(rb, e, "down");
  }
  if (now >= rb->next_idle) { /* conversations nothing was heard of for check_ms */
    rb->next_idle = now + (uint64_t)rb->check_ms;
    size_t k = 0, b = rb->idle_cursor;
    for (size_t seen = 0; seen < INTEREST_BUCKETS && k < REDIS_BUS_CHECK_MAX; seen++) {
      for (interest_t *e = rb->buckets[b]; e; e = e->next)
        if (rb->inst[e->inst].up && now - e->last_heard >= (uint64_t)rb->check_ms) {
          want_check(rb, e, "idle");
          k++;
        }
      b = (b + 1) % INTEREST_BUCKETS;
    }
    rb->idle_cursor = b;
  }
  start_check(rb);
}

/* ---- lifecycle --------------------------------------------------------------- */

int redis_bus_start(uv_loop_t *loop, bus_t *bus, pool_t *const *pool, const char *node_id,
                    const char *urls, int check_ms, metrics_t *metrics, redis_bus_t **out) {
  redis_bus_t *rb = calloc(1, sizeof *rb);
  if (!rb) return -CV_ENOMEM;
  char why[300];
  busurl_t urlv[BUSURL_MAX];
  if (!urls || busurl_parse(urls, urlv, &rb->n, why, sizeof why) != 0 || check_ms <= 0 ||
      rb->n > REDIS_BUS_MAX) {
    free(rb);
    return -CV_EINVAL;
  }
  for (int i = 0; i < rb->n; i++) {
    inst_t *ri = &rb->inst[i];
    ri->rb = rb;
    ri->index = i;
    memcpy(ri->host, urlv[i].host, sizeof ri->host);
    ri->port = urlv[i].port;
    snprintf(ri->shown, sizeof ri->shown, "redis://%.255s:%d", urlv[i].host, urlv[i].port);
  }
  rb->loop = loop;
  rb->bus = bus;
  rb->pool = pool;
  rb->metrics = metrics;
  rb->check_ms = check_ms;
  snprintf(rb->node_id, sizeof rb->node_id, "%s", node_id);
  unsigned char rnd[TAG_LEN / 2];
  if (RAND_bytes(rnd, sizeof rnd) != 1) {
    free(rb);
    return -CV_ENOMEM;
  }
  for (size_t i = 0; i < sizeof rnd; i++) snprintf(rb->tag + 2 * i, 3, "%02x", rnd[i]);
  rb->serial = 0;
  uint64_t now = util_mono_ms();
  rb->next_poll = now + REDIS_BUS_POLL_MS;
  rb->next_idle = now + (uint64_t)check_ms;
  uv_timer_init(loop, &rb->timer);
  rb->timer.data = rb;
  uv_check_init(loop, &rb->flush);
  rb->flush.data = rb;
  rb->handles_open = 2;
  uv_timer_start(&rb->timer, tick_cb, TICK_MS, TICK_MS);
  uv_check_start(&rb->flush, flush_cb);
  uv_unref((uv_handle_t *)&rb->flush);
  for (int i = 0; i < rb->n; i++) {
    gauge_up(&rb->inst[i]);
    gauge_subs(&rb->inst[i]);
    inst_connect(&rb->inst[i]);
  }
  bus_remote_t remote = {.publish = remote_publish, .interest = remote_interest, .ud = rb};
  bus_set_routed(bus, &remote, node_id);
  log_info("bus: %d Redis instance(s), conversations checked against the store after %d ms "
           "without news",
           rb->n, check_ms);
  *out = rb;
  return 0;
}

int redis_bus_count(const redis_bus_t *rb) { return rb->n; }

int redis_bus_up(const redis_bus_t *rb) {
  int k = 0;
  for (int i = 0; i < rb->n; i++) k += rb->inst[i].up;
  return k;
}

static void handle_closed(uv_handle_t *h) {
  redis_bus_t *rb = h->data;
  if (--rb->handles_open > 0) return;
  for (size_t b = 0; b < INTEREST_BUCKETS; b++) {
    interest_t *e = rb->buckets[b];
    while (e) {
      interest_t *next = e->next;
      free(e);
      e = next;
    }
  }
  vec_clear(&rb->due);
  vec_clear(&rb->retry);
  free(rb);
}

void redis_bus_close(redis_bus_t *rb) {
  rb->closing = 1;
  for (int i = 0; i < rb->n; i++) {
    inst_t *ri = &rb->inst[i];
    drop_ctx(&ri->sub);
    drop_ctx(&ri->pub);
    ops_clear(ri);
    free(ri->ops);
    for (size_t k = 0; k < REDIS_BUS_UNSENT_MAX; k++) unsent_free(&ri->unsent[k]);
  }
  uv_close((uv_handle_t *)&rb->timer, handle_closed);
  uv_close((uv_handle_t *)&rb->flush, handle_closed);
}
