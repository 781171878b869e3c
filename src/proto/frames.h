/*
 * frames: JSON encoding of server frames and decoding of client frames,
 * protocol v1 (docs/protocol.md). Pure functions, any thread.
 * jansson rule for the whole project: a function that returns json_t *
 * returns a new reference the caller owns; arguments are borrowed unless a
 * comment says "steals".
 */
#ifndef CONVERGER_PROTO_FRAMES_H
#define CONVERGER_PROTO_FRAMES_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "store/store.h"

typedef enum {
  FRAME_HELLO,
  FRAME_SYNC,
  FRAME_SEND,
  FRAME_PING,
  FRAME_SUBSCRIBE,   /* v1.1 */
  FRAME_UNSUBSCRIBE, /* v1.1 */
  FRAME_REFRESH,     /* v1.1 */
  FRAME_PRESENCE,    /* v1.2 */
  FRAME_SIGNAL,      /* v1.2 */
} frame_type_t;

/* welcome.protocol: the version of docs/protocol.md this node speaks. */
#define FRAME_PROTOCOL_VERSION "1.2"

#define FRAME_WATERMARK_NONE (-1) /* watermark null or absent: start at the head */

/* presenceEvents of a subscription (docs/protocol.md 4.9). */
#define FRAME_EVENTS_NONE    0 /* absent or false */
#define FRAME_EVENTS_USERS   1 /* true or "users": a user's first join and last leave */
#define FRAME_EVENTS_CLIENTS 2 /* "clients": every client instance's */

#define FRAME_PRESENCE_PAGE_MAX 1000 /* members in one presence page */
#define FRAME_PRESENCE_PAGE     100  /* ... when `limit` is not given */
#define FRAME_SIGNAL_BYTES_MAX  4096 /* a signal's body, as JSON text */

typedef struct {
  char conv[STORE_ID_MAX + 1];
  int64_t watermark;               /* >= 0, or FRAME_WATERMARK_NONE */
  char epoch[STORE_EPOCH_MAX + 1]; /* the epoch the watermark is in; "" when not given */
  int presence_events;             /* FRAME_EVENTS_* */
} frame_sub_t;

/* A decoded client frame. Strings point into `root` (kept alive by it). */
typedef struct {
  frame_type_t type;
  json_t *root;      /* owned; frame_client_clear releases it */
  const char *token; /* hello, refresh */
  const char *client_id; /* hello (1.1): NULL when not given */
  frame_sub_t *subs; /* hello; heap array */
  size_t nsubs;
  const char *conv;                /* sync, send, subscribe, unsubscribe, presence, signal */
  int64_t watermark;               /* sync (>= 0); subscribe (or FRAME_WATERMARK_NONE) */
  char epoch[STORE_EPOCH_MAX + 1]; /* sync, subscribe; "" when not given */
  const char *id;    /* send */
  json_t *body;      /* send, signal; borrowed from root */
  int presence_events; /* subscribe: FRAME_EVENTS_* */
  int limit;           /* presence: 1..FRAME_PRESENCE_PAGE_MAX */
  const char *cursor;  /* presence: the page after this user; NULL for the first */
  int members;         /* presence: 0 for the count alone */
  int known_type;    /* on a decode failure: 1 when `type` was a known
                        frame type (then `type` is set) */
  /* On a decode failure of a frame about one conversation whose `conv` was
   * valid and a later field was not: that `conv`, so that the error can
   * carry it (docs/protocol.md 4.5); "" otherwise. */
  char bad_conv[STORE_ID_MAX + 1];
} frame_client_t;

/* Decode one client text message. On success fills `out` (clear it with
 * frame_client_clear) and returns 0. On failure returns -CV_EINVAL and sets
 * `why` (a message for the error frame, at most `why_len` bytes);
 * out->known_type and out->type then tell which frame it tried to be, and
 * out->bad_conv the conversation it was about when its `conv` was valid.
 * `max_subs` bounds hello subscriptions. */
int frame_decode(const char *text, size_t len, int max_subs, frame_client_t *out, char *why,
                 size_t why_len);
void frame_client_clear(frame_client_t *f);

/* Server frames as compact JSON text (heap; caller frees). NULL on OOM. */
/* {"type":"msg","conv","seq","epoch","id","sender","ts","body"}; "epoch"
 * only when m->epoch is not empty. m->epoch is written as it is, unquoted
 * inside the quotes: it must hold no character JSON escapes (the store's
 * epochs are hex; postgres.c's NOTIFY template relies on this too). */
char *frame_msg(const char *conv, const store_msg_t *m);
char *frame_error(const char *code, const char *message, const char *conv, long retry_after_ms,
                  json_t *details /* steals; may be NULL */);
/* {"type":"synced","conv","head","epoch"} and "reset":true when `reset`
 * (docs/protocol.md, "Epochs and resets"); "epoch" only when `epoch` is
 * neither NULL nor empty. */
char *frame_synced(const char *conv, int64_t head, const char *epoch, int reset);
char *frame_sent(const char *conv, const char *id, int64_t seq);
/* v1.1 (docs/protocol.md 5.8 to 5.10):
 * {"type":"subscribed","conv","head","epoch","presence"} and "reset":true
 * when `reset`, "already":true when `already` (a second subscribe);
 * {"type":"unsubscribed","conv"}; {"type":"refreshed","expiresInMs"}. */
char *frame_subscribed(const char *conv, int64_t head, const char *epoch, int presence, int reset,
                       int already);
char *frame_unsubscribed(const char *conv);
char *frame_refreshed(int64_t expires_in_ms);
char *frame_pong(void);
/* v1.2 (docs/protocol.md 5.11 to 5.13):
 * {"type":"presence","conv","count","members":[{"user","clients","since"}],
 *  "cursor"} (members and cursor only when `with_members`; cursor null on
 * the last page; "truncated":true when `truncated`: members past
 * max_presence are counted, not listed);
 * {"type":"join"|"leave","conv","user","client"};
 * {"type":"signal","conv","sender","ts","body"} (`body` JSON text, put in
 * as it is). */
char *frame_presence(const char *conv, const store_member_t *m, size_t n, int64_t count,
                     int with_members, const char *cursor, int truncated);
char *frame_presence_event(int join, const char *conv, const char *user, const char *client);
char *frame_signal(const char *conv, const char *sender, int64_t ts_ms, const char *body);
/* {"type":"drain","afterMs":..,"reconnectTo":URL or null,"deadlineMs":..}
 * (docs/protocol.md 5.6); `reconnect_to` NULL for null. */
char *frame_drain(int64_t after_ms, const char *reconnect_to, int64_t deadline_ms);

/* JSON text of `v` (compact, any type). Caller frees. */
char *frame_dump(json_t *v);

#endif
