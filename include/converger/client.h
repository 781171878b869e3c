/*
 * converger/client.h: libconverger-client, the C client of a converger
 * gateway (protocol 1.1, docs/protocol.md).
 *
 * Two layers:
 *   - cvg_core_*: a sans-I/O state machine. It owns no socket and no clock:
 *     the caller feeds it events (a transport opened, a text frame, a
 *     transport closed, the timer fired, the application sends) with the
 *     current time in ms, and takes back actions (open a transport to a URL,
 *     send a text frame, close a transport, arm the timer) with
 *     cvg_core_next_action(). Tests drive it with a fake clock.
 *   - cvg_client_*: the core driven over real TCP on a libuv loop (HTTP
 *     upgrade, RFC 6455 framing with masks, connect timeout). Many clients
 *     may share one loop.
 *
 * What the core does for the application:
 *   - reconnects after any loss with a backoff strategy (default
 *     decorrelated jitter, 250 ms, cap 10 s); a server retry hint
 *     (`retryAfterMs` of an `error` frame or of a close reason, as 1012 and
 *     1013 and an operator's disconnect carry it) is
 *     a floor (unless ignore_hints); a welcome resets the attempt count; the
 *     next attempt goes to a random URL other than the one that just failed
 *     (or, with CVG_RECONNECT_NEXT, to the next URL in the list);
 *   - delivers each message once and in order per conversation: a message
 *     is delivered only when its seq is the watermark + 1; a seq at or below
 *     the watermark is a duplicate and dropped; a seq beyond watermark + 1
 *     sends one `sync` from the watermark;
 *   - keeps each conversation's epoch (the identity of its history) next to
 *     its watermark and sends both when it resumes; when the node answers
 *     that the history the watermark was in is not its own (a watermark
 *     above the head, or another epoch: a restored or recreated store), or
 *     a `msg` comes with a new epoch, it calls on_reset and continues from
 *     the node's head: it never drops a new message as a duplicate of an old
 *     one and never skips one silently (docs/protocol.md, "Epochs and
 *     resets");
 *   - keeps each send until the server answers `sent`, and sends it again
 *     with the same id (the idempotency key) after the next welcome;
 *   - subscriptions may be added and removed at any time
 *     (cvg_core_subscribe, cvg_core_unsubscribe); the set, with each
 *     watermark, is what every later hello carries, so it survives
 *     reconnects and drain moves;
 *   - with a token callback (cvg_options_t.token_cb), refreshes the token at
 *     about 80 % of its lifetime (welcome.expiresInMs), jittered so that
 *     many clients do not refresh at one instant, retries a callback that
 *     fails with backoff, and asks for a new token before reconnecting
 *     after the node closed with token_expired;
 *   - a frame the node refuses with rate_limited (a send, a sync, a
 *     subscribe, a refresh) is sent again after its retryAfterMs; it does
 *     not fail;
 *   - an `unavailable` that keeps the connection open (a sharded cluster's
 *     node whose shard of that conversation is down, docs/protocol.md 2.3,
 *     4.3, 4.5) is retried on the same connection after its retryAfterMs
 *     (the first backoff step without one): a refused hello entry or
 *     subscribe is subscribed again (it stays in the set; the other
 *     subscriptions go on), a refused send is sent again with its id. The
 *     hint is also the floor of a reconnect should the connection be lost
 *     (an older node closes with 1013 after `unavailable`; the send then
 *     goes again once, after the next welcome);
 *   - on `drain`, opens a second connection after `afterMs`, says hello with
 *     the current watermarks, and closes the old one with 1000 only once the
 *     new one is welcomed (make-before-break); a ws:// reconnectTo on a
 *     wss:// connection is not followed (on_error "downgrade_refused"; the
 *     move goes to a configured URL). A move that fails keeps
 *     the old connection and is tried again, on a random other URL, after
 *     the backoff (the hint a floor) when that is still before the frame's
 *     `deadlineMs`; otherwise the client waits for the server's close.
 *
 * Threads: a client (core or libuv) belongs to one thread, the one running
 * its loop; no function here may be called from another thread.
 * Strings passed in are copied unless said otherwise; strings passed to
 * callbacks are valid during the callback only.
 * Errors: functions return 0 or a negative CVG_E* code.
 */
#ifndef CONVERGER_CLIENT_H
#define CONVERGER_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define CVG_API __attribute__((visibility("default")))
#else
#define CVG_API
#endif

/* Error returns. */
#define CVG_EINVAL (-22) /* a bad argument or option */
#define CVG_ENOMEM (-12) /* out of memory */
#define CVG_ESTATE (-3)  /* not possible in the client's state (closed, failed) */
#define CVG_EBUSY  (-16) /* too many sends waiting for their `sent` */
#define CVG_E2BIG  (-7)  /* a send frame larger than max_message_bytes */
#define CVG_ENOENT (-2)  /* no such subscription */

/* A subscription's watermark meaning "no history: start live at the head"
 * (hello's `"watermark": null`). 0 means "everything from seq 1". */
#define CVG_WATERMARK_NONE (-1)

/* A close code the core asks for that means "drop the TCP connection
 * without a close frame" (RFC 6455 section 7.4.1: 1006 is never sent). */
#define CVG_CLOSE_ABORT 1006

typedef enum {
  CVG_BACKOFF_DECORRELATED = 0, /* random in [base, 3 * previous]; above the cap, random in
                                   [cap - (cap - base) / 20, cap] (docs/protocol.md 8); the
                                   default */
  CVG_BACKOFF_FULL,             /* random in [0, min(cap, base * 2^n)) */
  CVG_BACKOFF_EQUAL,            /* half of min(cap, base * 2^n) plus a random half */
  CVG_BACKOFF_EXPONENTIAL,      /* min(cap, base * 2^n), no jitter (experiments only) */
  CVG_BACKOFF_ADDITIVE,         /* min(cap, base * 2^n) + random in [0, jitter] (the reconnect-storm
                                   post-mortem's policy; experiments only) */
  CVG_BACKOFF_PROPORTIONAL, /* min(cap, base * 2^n) * random in [0.5, 1.5] (the old harness of the
                               admission-queue decision record; experiments only) */
} cvg_backoff_strategy_t;

/* Which URL a reconnect goes to (cvg_options_t.reconnect). Either way the
 * first attempt goes to a random URL, and a drain frame's `reconnectTo`,
 * when it names a URL (and does not take a wss:// connection to ws://), is
 * where the migration goes. Once the move is welcomed, that URL is the one
 * the client is on: a reconnect after its loss goes on from its place in
 * the list (from the place of the connection it left when it is not in the
 * list). */
typedef enum {
  CVG_RECONNECT_RANDOM = 0, /* a random URL other than the one that failed; the default (what a
                               load balancer spreading reconnects over ready nodes does) */
  CVG_RECONNECT_NEXT,       /* the URL after the one that failed, wrapping around (the old harness
                               of the admission-queue decision record; experiments only: a drained
                               node's clients all land on one survivor) */
} cvg_reconnect_t;

typedef enum {
  CVG_STATE_IDLE = 0,   /* created, not started */
  CVG_STATE_CONNECTING, /* an attempt is in progress and no connection is welcomed */
  CVG_STATE_CONNECTED,  /* a connection is welcomed */
  CVG_STATE_MIGRATING,  /* welcomed, and a second connection is opening after a drain */
  CVG_STATE_WAITING,    /* no connection: the next attempt waits for its backoff */
  CVG_STATE_FAILED,     /* stopped for good: the server refused the token (unauthorized) */
  CVG_STATE_CLOSED,     /* closed by the application */
} cvg_state_t;

/* Longest epoch (bytes), as the node accepts it in hello and sync (its own
 * are 8). */
#define CVG_EPOCH_MAX 16

/* One subscription: a conversation id and the last seq the application has
 * (CVG_WATERMARK_NONE: start live at the head). Its epoch, when the
 * application kept one, goes in cvg_options_t.epochs. */
typedef struct {
  const char *conv;
  int64_t watermark;
} cvg_sub_t;

/* A delivered message. All pointers are valid during the callback only. */
typedef struct {
  const char *conv;
  int64_t seq;
  const char *id;     /* the sender's message id */
  const char *sender; /* the `sub` of the sender's token */
  const char *ts;     /* RFC 3339 UTC with ms, from the server */
  const char *body;   /* the body as compact JSON text, NUL-terminated */
  const char *frame;  /* the whole `msg` frame as received (JSON text) */
  size_t frame_len;
} cvg_message_t;

/* Application callbacks; any may be NULL. `ud` is cvg_options_t.userdata. */
typedef struct {
  /* A message, once, in seq order within its conversation. */
  void (*on_message)(void *ud, const cvg_message_t *m);
  /* A replay is done for `conv` (after a hello or a sync): live from `head`. */
  void (*on_synced)(void *ud, const char *conv, int64_t head);
  /* The client's state changed; `detail` says why in words (a URL, a close
   * code and reason, a delay). */
  void (*on_state)(void *ud, cvg_state_t state, const char *detail);
  /* An `error` frame from the server (`conv` may be NULL). Errors that end a
   * subscription (forbidden, not_found, channel_inactive) remove it from
   * later hellos. Also the client's own "downgrade_refused" (`conv` NULL):
   * a `drain` frame on a wss:// connection named a ws:// reconnectTo, which
   * the client did not follow (it moves to one of its own URLs instead;
   * docs/protocol.md 5.6). */
  void (*on_error)(void *ud, const char *code, const char *message, const char *conv);
  /* `conv`'s history is not the one `old_watermark` was in: the watermark
   * was above the node's head, or the epoch changed (a store restored from
   * a backup, or recreated). Messages up to `old_watermark` that the
   * application has may be gone or be different messages now. Delivery
   * continues with head + 1 in `epoch`; the history up to `head` is the
   * application's to read again (REST) if it needs it. `old_epoch` is ""
   * when it was unknown. Added after the others: keep it last. */
  void (*on_reset)(void *ud, const char *conv, int64_t old_watermark, const char *old_epoch,
                   int64_t head, const char *epoch);
  /* The node ended the subscription of `conv` (protocol 1.1 `unsubscribed`
   * that the application did not ask for: an operator's POST
   * /admin/users/{user}/unsubscribe, a refreshed token that no longer
   * covers it, a deactivated channel). It is gone from the set. An
   * operator's end of a subscribe not answered yet comes after on_error
   * `cancelled`; the `cancelled` that answers a subscribe the application
   * itself unsubscribed from (docs/protocol.md 4.6) is not told. */
  void (*on_unsubscribed)(void *ud, const char *conv);
} cvg_callbacks_t;

/* A token callback (cvg_options_t.token_cb): write a fresh token for the
 * same user, NUL-terminated, into `out` (`cap` bytes) and return 0, or
 * return non-zero when none can be had now (it is asked again after a
 * backoff: 1 s doubling to 30 s, jittered). `why` is "refresh" (the token
 * nears its expiry) or "expired" (the node closed with token_expired).
 * Called on the loop thread, from within a core event: it should be quick
 * (a cached token, a local signer); an application that fetches tokens
 * over the network returns non-zero and calls cvg_core_set_token /
 * cvg_client_set_token once it has one. */
typedef int (*cvg_token_cb)(void *ud, const char *why, char *out, size_t cap);

/* The outcome of a cvg_send: `error` is NULL and `seq` > 0 once the server
 * committed the message; otherwise `error` is the server's error code
 * for that send (forbidden, not_found, channel_inactive), "too_large" (the
 * node closed with 1009 while it was the largest send in flight on that
 * connection: over the node's message limit), or the client's: "closed"
 * (closed by the application), "unauthorized" (the token was refused) or
 * "no_subscription" (every subscription ended, so no hello is possible);
 * seq is then 0. A send the node refused with rate_limited is sent again
 * after the hint, and one refused with unavailable after the hint on the
 * same connection (a sharded cluster's node keeps it open) or, when the
 * node closes with 1013, after the reconnect, with the same id: none of
 * these completes it. Called exactly once per accepted send. */
typedef void (*cvg_sent_cb)(void *ud, const char *conv, const char *id, int64_t seq,
                            const char *error);

typedef struct {
  const char *const *urls; /* ws://host:port/v1/ws; at least one, all ws:// or all wss://, the
                              scheme in any case (a client on wss never moves to ws:
                              cvg_core_new refuses a mix, and any other scheme) */
  size_t nurls;
  const char *token; /* the JWT for hello */
  const cvg_sub_t *subs;
  size_t nsubs;            /* 0 .. 100; 0: none at first, added with cvg_core_subscribe (the
                              empty hello this sends needs a 1.1 node) */
  const char *client_name; /* optional `client` of hello; NULL: none */
  cvg_backoff_strategy_t backoff;
  int64_t backoff_base_ms;    /* 0: 250 */
  int64_t backoff_cap_ms;     /* 0: 10 000 */
  int64_t backoff_jitter_ms;  /* additive only; 0: 100 */
  int64_t connect_timeout_ms; /* from the attempt to the welcome; 0: 15 000 */
  int migrate_on_drain;       /* 1 (cvg_options_init): make-before-break on `drain` */
  size_t max_pending_sends;   /* sends waiting for `sent`; 0: 10 000 */
  size_t max_message_bytes;   /* largest send frame, bytes; 0: 65 536 (the node's default) */
  uint64_t seed;              /* random source; 0: seeded from the OS CSPRNG */
  cvg_callbacks_t cb;
  void *userdata;
  /* Options for experiments, last so that the fields above keep the
   * offsets they had before these were added. */
  cvg_reconnect_t reconnect; /* the URL of a reconnect; CVG_RECONNECT_RANDOM (0) by default */
  /* 1: the server's retry hints are not a floor of the backoff: the
   * retryAfterMs of an `unavailable` error frame, of a close
   * reason and of an HTTP 503's Retry-After are ignored, and a
   * `replay_unavailable` sync (and a subscription or send refused with
   * `unavailable` on a connection kept open) is retried after
   * backoff_base_ms instead of its retryAfterMs. For experiments reproducing the old harness of the
   * admission-queue decision record only; 0 (the default) honours them. */
  int ignore_hints;
  /* NULL, or `nsubs` entries: the epoch of each subscription's watermark
   * as cvg_core_epoch returned it when the application saved the
   * watermark (NULL or "": unknown; at most CVG_EPOCH_MAX bytes of
   * [A-Za-z0-9._:-]). With it, a resume into a restored store is told to
   * reset even when the new head has passed the watermark. */
  const char *const *epochs;
  /* NULL, or the token callback (see cvg_token_cb). Without one the token
   * is never refreshed, and a token_expired close fails the client. */
  cvg_token_cb token_cb;
  /* This client instance's id in every hello (`clientId`, protocol 1.1):
   * the same across its reconnects and drain moves, so the node can tell
   * one client from another of the same user. NULL: a random one made at
   * cvg_core_new (cvg_core_client_id reads it). 1 to 128 characters of
   * [A-Za-z0-9._:-]. */
  const char *client_id;
  /* Protocol 1.2 (docs/protocol.md 4.9, 4.10), last so that the fields
   * above keep their offsets. presence_events: CVG_PRESENCE_NONE (0),
   * CVG_PRESENCE_USERS (a user's first join and last leave) or
   * CVG_PRESENCE_CLIENTS (every client instance's), asked for on every
   * subscription of a channel with presence. on_presence: a join (1) or
   * leave (0) of `client` of `user` in `conv`, told by the connection in
   * use (during a drain move, the old one until the new is welcomed):
   * at most once, never replayed. on_signal: a signal of `conv` from
   * `sender` at `ts_ms` (wall ms), `body` its JSON text; at most once.
   * Both only for a conversation in the current set: none follows its
   * cvg_unsubscribe or its end. Either may be NULL. */
  int presence_events;
  void (*on_presence)(void *ud, const char *conv, int join, const char *user, const char *client);
  void (*on_signal)(void *ud, const char *conv, const char *sender, int64_t ts_ms,
                    const char *body);
  /* TLS for wss:// URLs (OpenSSL; TLS 1.2 or later). The server's
   * certificate is verified, and its name against the URL's host (or its
   * IP address for an IP literal), which is also sent as SNI; there is no
   * way to turn verification off. tls_ca_file (a PEM bundle) and
   * tls_ca_dir (a hashed directory, c_rehash) name the certificates to
   * trust; both NULL: the system's (/etc/ssl/certs). A certificate that
   * does not verify fails the connection with a reason that says why
   * ("TLS: certificate verify failed for HOST: self-signed certificate"),
   * which on_state's reason carries; it is retried with backoff like any
   * failed connection. cvg_client_new fails (CVG_EINVAL, with the reason
   * in err) when the files cannot be read. Borrowed: read at
   * cvg_client_new only. */
  const char *tls_ca_file;
  const char *tls_ca_dir;
} cvg_options_t;

enum { CVG_PRESENCE_NONE = 0, CVG_PRESENCE_USERS = 1, CVG_PRESENCE_CLIENTS = 2 };

/* Counters, readable at any time. */
typedef struct {
  cvg_state_t state;
  uint64_t attempts;     /* connections opened */
  uint64_t welcomes;     /* welcomes received */
  uint64_t delivered;    /* messages given to on_message */
  uint64_t duplicates;   /* messages dropped because seq <= watermark */
  uint64_t gaps;         /* syncs sent because seq > watermark + 1 */
  uint64_t gaps_filled;  /* of those, syncs answered by `synced` */
  uint64_t unavailable;  /* `unavailable` answers (error frame, 1013 close, HTTP 503); a
                            subscription's refusal is not counted, a send's is */
  uint64_t bad_frames;   /* server frames ignored: not JSON, unknown type, wrong field */
  uint64_t migrations;   /* drains completed make-before-break */
  uint64_t resent;       /* sends sent again after a reconnect */
  int64_t offline_ms;    /* total time without a welcomed connection since start */
  char node[64];         /* `node` of the welcomed connection; "" when none */
  uint64_t resets;       /* on_reset calls (added last: the fields above keep their offsets) */
  uint64_t rate_limited; /* frames the node refused with rate_limited (each sent again) */
  uint64_t refreshes;    /* tokens the node took in a `refreshed` */
} cvg_stats_t;

/* Fill `o` with the defaults (everything zero, migrate_on_drain = 1). */
CVG_API void cvg_options_init(cvg_options_t *o);

/* Strategy by name ("decorrelated", "full", "equal", "exponential",
 * "additive", "proportional"): 0, or CVG_EINVAL for an unknown name. */
CVG_API int cvg_backoff_parse(const char *name, cvg_backoff_strategy_t *out);

/* Name of a strategy, or of a state (static strings). */
CVG_API const char *cvg_backoff_name(cvg_backoff_strategy_t s);
CVG_API const char *cvg_state_name(cvg_state_t s);

/* ---- the sans-I/O core ---------------------------------------------------- */

typedef struct cvg_core_s cvg_core_t;

typedef enum {
  CVG_ACT_OPEN = 1, /* open transport `transport` to `url`, then call cvg_core_opened */
  CVG_ACT_SEND,     /* send `data` (`len` bytes) as one text frame on `transport` */
  CVG_ACT_CLOSE,    /* close `transport` with `code` and `reason` (CVG_CLOSE_ABORT: drop
                       it); the core has forgotten it and ignores its later events */
  CVG_ACT_TIMER,    /* call cvg_core_timer at `at_ms` (replaces the previous timer);
                       at_ms < 0: no timer needed */
} cvg_action_type_t;

typedef struct {
  cvg_action_type_t type;
  uint32_t transport; /* OPEN, SEND, CLOSE: the core's id of the transport */
  const char *url;    /* OPEN */
  const char *data;   /* SEND: the frame, NUL-terminated */
  size_t len;         /* SEND */
  int code;           /* CLOSE */
  const char *reason; /* CLOSE */
  int64_t at_ms;      /* TIMER, on the caller's clock */
} cvg_action_t;

/* Create a core from `opt` (copied, strings included). Returns 0, or
 * CVG_EINVAL with a one-line reason in `err` (a URL that is not ws://, no
 * URL, no token, a subscription with a bad id, too many subscriptions) or
 * CVG_ENOMEM. `err` may be NULL. The caller frees *out with cvg_core_free. */
CVG_API int cvg_core_new(const cvg_options_t *opt, cvg_core_t **out, char *err, size_t errlen);
CVG_API void cvg_core_free(cvg_core_t *core);

/* Events. `now_ms` is the caller's monotonic clock; it must not go back.
 * Events for a transport the core has closed or never opened are ignored. */
CVG_API void cvg_core_start(cvg_core_t *core, int64_t now_ms);
/* The transport's WebSocket is open (the upgrade succeeded). */
CVG_API void cvg_core_opened(cvg_core_t *core, uint32_t transport, int64_t now_ms);
/* A text frame from the server (`len` bytes, not necessarily NUL-terminated). */
CVG_API void cvg_core_text(cvg_core_t *core, uint32_t transport, const char *data, size_t len,
                           int64_t now_ms);
/* Any other sign of life from the server (a ping frame). */
CVG_API void cvg_core_alive(cvg_core_t *core, uint32_t transport, int64_t now_ms);
/* The transport is gone: the server's close code and reason (`len` bytes;
 * JSON with retryAfterMs for 1012, 1013 or an operator's disconnect), or CVG_CLOSE_ABORT when the
 * TCP connection failed or ended without a close frame. An HTTP 503 answer to the upgrade is
 * reported as 1013 with {"retryAfterMs": Retry-After * 1000}. */
CVG_API void cvg_core_closed(cvg_core_t *core, uint32_t transport, int code, const char *reason,
                             size_t len, int64_t now_ms);
/* The timer armed by the last CVG_ACT_TIMER fired (early calls are harmless). */
CVG_API void cvg_core_timer(cvg_core_t *core, int64_t now_ms);
/* Close every transport with 1000 and stop; pending sends complete with
 * "closed". The core stays readable (stats) until freed. */
CVG_API void cvg_core_stop(cvg_core_t *core, int64_t now_ms);

/* Send `body` (JSON text) to `conv` with message id `id` (NULL: a random
 * UUID). `cb` (may be NULL) is called once with the outcome. Returns 0, or
 * CVG_EINVAL (bad conv or id, body not JSON), CVG_E2BIG (the frame would be
 * over max_message_bytes), CVG_EBUSY (max_pending_sends waiting),
 * CVG_ESTATE (stopped or failed), CVG_ENOMEM; then `cb` is not called. A
 * send the server still refuses as too large (close 1009) completes with
 * "too_large" and is not sent again. */
CVG_API int cvg_core_send(cvg_core_t *core, const char *conv, const char *id, const char *body,
                          cvg_sent_cb cb, void *ud, int64_t now_ms);

/* Subscribe to `conv` from `watermark` (CVG_WATERMARK_NONE: live from the
 * head; 0: from seq 1) in `epoch` (NULL or "": unknown; see
 * cvg_options_t.epochs). With a welcomed connection a `subscribe` frame
 * goes out now (answered by `subscribed`, the replay, on_synced);
 * otherwise the next hello carries it. The subscription is kept across
 * reconnects. Returns 0 (also when already subscribed: nothing changes),
 * CVG_EINVAL (bad id, watermark or epoch), CVG_EBUSY (100 subscriptions
 * already), CVG_ESTATE (stopped or failed), CVG_ENOMEM. */
CVG_API int cvg_core_subscribe(cvg_core_t *core, const char *conv, int64_t watermark,
                               const char *epoch, int64_t now_ms);

/* End the subscription of `conv`: no message of it is delivered after this
 * call, and later hellos leave it out. A subscribe of it still unanswered
 * ends here too: nothing of it (on_synced, on_error) follows, and a
 * cvg_core_subscribe of the same conversation after this call is a new
 * one. Returns 0, or CVG_ENOENT when there is no such subscription. */
CVG_API int cvg_core_unsubscribe(cvg_core_t *core, const char *conv, int64_t now_ms);

/* Replace the token (the same user's): sent at once in a `refresh` when a
 * connection is welcomed, else used by the next hello. For applications
 * that fetch tokens asynchronously. Returns 0, CVG_EINVAL (empty),
 * CVG_ESTATE, CVG_ENOMEM. */
CVG_API int cvg_core_set_token(cvg_core_t *core, const char *token, int64_t now_ms);

/* The next action to carry out: 1 with *out filled, or 0 when there is none.
 * Pointers in *out stay valid until the next call of cvg_core_next_action or
 * cvg_core_free. Call it until it returns 0 after every event. */
CVG_API int cvg_core_next_action(cvg_core_t *core, cvg_action_t *out);

/* Counters at `now_ms` (offline_ms includes the current offline span). */
CVG_API void cvg_core_stats(const cvg_core_t *core, int64_t now_ms, cvg_stats_t *out);

/* The watermark of `conv`: its last delivered seq, CVG_WATERMARK_NONE before
 * the first welcome of a subscription started at the head, or CVG_EINVAL
 * when the core has no such subscription. */
CVG_API int64_t cvg_core_watermark(const cvg_core_t *core, const char *conv);

/* The client id every hello carries (cvg_options_t.client_id, or the one
 * made at creation). Valid while the core lives. */
CVG_API const char *cvg_core_client_id(const cvg_core_t *core);

/* The epoch of `conv`'s watermark: the node's, from the last welcome,
 * synced or msg, or the one given in cvg_sub_t before that; "" when
 * unknown; NULL when the core has no such subscription. Valid until the
 * next event. Keep it with the watermark to resume later. */
CVG_API const char *cvg_core_epoch(const cvg_core_t *core, const char *conv);

/* ---- the libuv client ---------------------------------------------------- */

typedef struct cvg_client_s cvg_client_t;

/* Create a client on `loop` (borrowed; must outlive the client). Same
 * options and errors as cvg_core_new. Nothing happens before
 * cvg_client_start. Loop thread only. */
CVG_API int cvg_client_new(uv_loop_t *loop, const cvg_options_t *opt, cvg_client_t **out, char *err,
                           size_t errlen);

/* Start connecting. Returns 0, or CVG_ESTATE when already started. */
CVG_API int cvg_client_start(cvg_client_t *c);

/* cvg_core_send on the client (see there). */
CVG_API int cvg_send(cvg_client_t *c, const char *conv, const char *id, const char *body,
                     cvg_sent_cb cb, void *ud);

/* cvg_core_subscribe, cvg_core_unsubscribe and cvg_core_set_token on the
 * client (see there). */
CVG_API int cvg_subscribe(cvg_client_t *c, const char *conv, int64_t watermark, const char *epoch);
CVG_API int cvg_unsubscribe(cvg_client_t *c, const char *conv);
CVG_API int cvg_client_set_token(cvg_client_t *c, const char *token);
CVG_API const char *cvg_client_id(const cvg_client_t *c);

/* Counters (see cvg_stats_t) and watermarks. */
CVG_API void cvg_client_stats(const cvg_client_t *c, cvg_stats_t *out);
CVG_API int64_t cvg_client_watermark(const cvg_client_t *c, const char *conv);
CVG_API const char *cvg_client_epoch(const cvg_client_t *c, const char *conv);

/* Close the client: connections get a 1000 close frame, pending sends
 * complete with "closed", and once every handle is closed `on_closed` (may
 * be NULL) is called and the client is freed. May be called from a client
 * callback. The loop must run for the close to finish. */
CVG_API void cvg_client_close(cvg_client_t *c, void (*on_closed)(void *ud), void *ud);

#ifdef __cplusplus
}
#endif

#endif
