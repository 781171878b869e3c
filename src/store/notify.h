/*
 * notify: the NOTIFY payloads of the PostgreSQL store, a format of their
 * own. The append transaction writes them (store/postgres.c) and every
 * node's listener reads them (bus/pgnotify.c); nothing here knows wire
 * frames: the listener builds the msg frame from the fields.
 *
 * Payloads (text, at most STORE_NOTIFY_PAYLOAD_MAX bytes, PostgreSQL's
 * limit), on channel STORE_NOTIFY_CHANNEL:
 *   "m SEQ CONV EPOCH TS ID SENDER\nBODY"  a new message: its seq, its
 *                         conversation and that conversation's epoch, its
 *                         commit time (ms since the Unix epoch), id and
 *                         sender (ids: no space), then the body as stored
 *   "m SEQ CONV EPOCH"    a new message whose payload would not fit: a
 *                         head hint, the listener reads it from the store
 *                         (also read without EPOCH: "m SEQ CONV")
 * Earlier versions wrote "m SEQ CONV\nFRAME" and "m SEQ CONV EPOCH\nFRAME"
 * (the msg frame JSON after the newline): they are still read, as
 * NOTIFY_FRAME, so that nodes of this version keep hearing older ones
 * during a rolling upgrade (docs/operations.md, "Upgrading").
 *   "c 1 CHANNEL", "c 0 CHANNEL"  the channel was activated, deactivated
 *   "u d ORIGIN USER CODE RETRY\nREASON"  close every connection of USER
 *                         (POST /admin/users/USER/disconnect on node ORIGIN)
 *                         with close CODE (1000, 1001, 1008, 1011, 1012,
 *                         1013, 3000..4999), the hint RETRY ms (0: none, at
 *                         most 3600000) and REASON (0..80 printable bytes)
 *   "u u ORIGIN USER CONV"  end USER's subscriptions of CONV
 *                         (POST /admin/users/USER/unsubscribe on ORIGIN)
 *   "p j CONV CLIENT EDGE USER"  client instance CLIENT of USER is present
 *                         in CONV now; EDGE 1 when it is USER's first there
 *   "p l CONV CLIENT EDGE USER"  it is not any more (the presence grace
 *                         passed); EDGE 1 when it was USER's last there
 *   "s CONV TS SENDER\nBODY"  a signal (docs/protocol.md 4.10): not stored,
 *                         delivered to whoever is subscribed when it is heard;
 *                         TS its time (ms since the Unix epoch), BODY JSON
 * Anything else is not converger's and is ignored by the reader.
 *
 * Pure functions, any thread.
 */
#ifndef CONVERGER_STORE_NOTIFY_H
#define CONVERGER_STORE_NOTIFY_H

#include <stddef.h>
#include <stdint.h>

#include "store/store.h"

/* The seq placeholder of a template: the append statement replaces every
 * one with the seq it assigns (chr(1) cannot occur in ids or JSON text). */
#define NOTIFY_SEQ_MARK '\x01'
/* The epoch placeholder, for a template made before the epoch is read
 * (the group commit's function replaces it, chr(2)). */
#define NOTIFY_EPOCH_MARK '\x02'

/* The payload of a new message with NOTIFY_SEQ_MARK for its seq (a hint
 * when the whole message would not fit), and NOTIFY_EPOCH_MARK for its
 * epoch when `epoch` is NULL (room is kept for STORE_EPOCH_MAX bytes).
 * Heap string the caller frees; NULL when out of memory. */
char *notify_message_template(const char *conv, const char *epoch, const char *id,
                              const char *sender, const char *body, int64_t ts_ms);

/* The payload of message `m` of `conv` with its seq and epoch, of any
 * size (a sharded cluster's bus has no payload limit); a head hint when
 * the sender is not an id. Heap string the caller frees; NULL when out of
 * memory. */
char *notify_message(const char *conv, const store_msg_t *m);

typedef enum {
  NOTIFY_BAD = 0,
  NOTIFY_MESSAGE, /* the fields of a new message */
  NOTIFY_HINT,    /* a head hint */
  NOTIFY_CHANNEL, /* a channel's state */
  NOTIFY_FRAME,   /* an earlier version's "m SEQ CONV[ EPOCH]\nFRAME": the msg frame JSON itself */
  NOTIFY_USER_DISCONNECT,  /* close a user's connections */
  NOTIFY_USER_UNSUBSCRIBE, /* end a user's subscriptions of a conversation */
  NOTIFY_PRESENCE_JOIN,    /* a client is present in a conversation */
  NOTIFY_PRESENCE_LEAVE,   /* a client left it */
  NOTIFY_SIGNAL,           /* a signal for a conversation's subscribers */
} notify_kind_t;

/* A decoded payload. Strings are copies in the struct, except `body`,
 * which points into the payload. */
typedef struct {
  notify_kind_t kind;
  int64_t seq;                     /* MESSAGE, HINT */
  char conv[STORE_ID_MAX + 1];     /* MESSAGE, HINT, PRESENCE_*, SIGNAL; CHANNEL: the channel */
  char epoch[STORE_EPOCH_MAX + 1]; /* MESSAGE, HINT */
  int64_t ts_ms;                   /* MESSAGE, SIGNAL */
  char id[STORE_ID_MAX + 1];       /* MESSAGE */
  char sender[STORE_ID_MAX + 1];   /* MESSAGE, SIGNAL */
  const char *body;                /* MESSAGE: JSON text as stored; FRAME: the frame JSON; SIGNAL */
  int active;                      /* CHANNEL: 1 activated, 0 deactivated */
  char origin[STORE_ID_MAX + 1];   /* USER_*: the node the request came to */
  char user[STORE_ID_MAX +
            1]; /* USER_*, PRESENCE_*: the token sub; USER_UNSUBSCRIBE's conv is `conv` */
  char client[STORE_ID_MAX + 1]; /* PRESENCE_*: the client instance */
  int edge;                      /* PRESENCE_*: the user's first (join) or last (leave) client */
  int code;                      /* USER_DISCONNECT: the close code */
  int64_t retry_ms;              /* USER_DISCONNECT: the hint, 0 none */
  const char *reason;            /* USER_DISCONNECT: into the payload ("" none) */
} notify_t;

/* The fields of a user disconnect, as POST /admin/users/{user}/disconnect
 * takes them and a payload may carry them: `code` 1000, 1001, 1008, 1011,
 * 1012, 1013 or 3000..4999 (RFC 6455 section 7.4: ones converger gives a
 * meaning, and the applications' range), `reason` 0..80 bytes without
 * control characters, `retry_ms` 0..3600000. NULL when they are fine,
 * else what is wrong (a static message for an HTTP 400). */
const char *notify_disconnect_check(int64_t code, const char *reason, int64_t retry_ms);

/* The payloads of the user controls (see above), the disconnect's fields
 * as notify_disconnect_check accepts them. Heap strings; NULL when out of
 * memory or a field does not fit the format. */
char *notify_user_disconnect(const char *origin, const char *user, int code, int64_t retry_ms,
                             const char *reason);
char *notify_user_unsubscribe(const char *origin, const char *user, const char *conv);

/* The payloads of presence (`join` 1: "p j", 0: "p l") and of a signal
 * (`body` JSON text). Heap strings; NULL when out of memory or a field
 * does not fit (ids must be valid; a signal over STORE_NOTIFY_PAYLOAD_MAX). */
char *notify_presence(int join, const char *conv, const char *client, int edge, const char *user);
char *notify_signal(const char *conv, int64_t ts_ms, const char *sender, const char *body);

/* Decode `payload` (NUL-terminated) into `out`; returns out->kind
 * (NOTIFY_BAD for anything that is not one of the forms above). */
notify_kind_t notify_decode(const char *payload, notify_t *out);

/* A group commit's payload (store_append_batch: several new messages in
 * one NOTIFY):
 *   "b\nLEN PAYLOAD[LEN PAYLOAD]..."
 * where each PAYLOAD is a message payload of the forms above (an "m"),
 * LEN its length in bytes, in decimal. A group of one message is sent as
 * its own payload, without the frame, as a single append sends it.
 * notify_batch_next takes the next PAYLOAD from *p (which starts right
 * after "b\n" for the first call) into `buf` (`cap` bytes, NUL-terminated)
 * and advances *p: 1, or 0 at the end, or -1 when the rest is malformed
 * (the reader stops there). 1 when `payload` is such a batch. Pure, any
 * thread. */
int notify_is_batch(const char *payload);
int notify_batch_next(const char **p, char *buf, size_t cap);

#endif
