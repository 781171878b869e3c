#include "store/notify.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

char *notify_message_template(const char *conv, const char *epoch, const char *id,
                              const char *sender, const char *body, int64_t ts_ms) {
  char *out = NULL;
  char mark[2] = {NOTIFY_EPOCH_MARK, '\0'};
  /* the marks stand for up to 20 digits and STORE_EPOCH_MAX bytes once filled in */
  size_t full = 2 + 20 + 1 + strlen(conv) + 1 + (epoch ? strlen(epoch) : STORE_EPOCH_MAX) + 1 + 20 +
                1 + strlen(id) + 1 + strlen(sender) + 1 + strlen(body);
  /* the fields are ids (the store takes any sender: one that is not goes as a hint) */
  int ids = util_id_valid(conv) && (!epoch || util_id_valid(epoch)) && util_id_valid(id) &&
            util_id_valid(sender);
  if (!epoch) epoch = mark;
  if (ids && full <= STORE_NOTIFY_PAYLOAD_MAX &&
      asprintf(&out, "m %c %s %s %lld %s %s\n%s", NOTIFY_SEQ_MARK, conv, epoch, (long long)ts_ms,
               id, sender, body) < 0)
    out = NULL;
  if (out == NULL && asprintf(&out, "m %c %s %s", NOTIFY_SEQ_MARK, conv, epoch) < 0) out = NULL;
  return out;
}

char *notify_message(const char *conv, const store_msg_t *m) {
  char *out = NULL;
  int ids = util_id_valid(conv) && util_id_valid(m->epoch) && util_id_valid(m->id) && m->sender &&
            util_id_valid(m->sender) && m->body;
  if (ids && asprintf(&out, "m %lld %s %s %lld %s %s\n%s", (long long)m->seq, conv, m->epoch,
                      (long long)m->ts_ms, m->id, m->sender, m->body) < 0)
    out = NULL;
  if (!ids && asprintf(&out, "m %lld %s%s%s", (long long)m->seq, conv, m->epoch[0] ? " " : "",
                       m->epoch) < 0)
    out = NULL;
  return out;
}

/* The next space- (or end-) delimited field at *p into dst (cap bytes);
 * 0, or -1 when it is empty or too long. `last`: ends at '\n' or the end. */
static int field(const char **p, char *dst, size_t cap, int last) {
  const char *s = *p;
  size_t n = strcspn(s, last ? "\n" : " \n");
  if (n == 0 || n >= cap) return -1;
  memcpy(dst, s, n);
  dst[n] = '\0';
  *p = s + n;
  return 0;
}

static int number(const char **p, int64_t *out) {
  char buf[24], *end;
  if (field(p, buf, sizeof buf, 0) != 0 || buf[0] < '0' || buf[0] > '9') return -1;
  errno = 0;
  long long v = strtoll(buf, &end, 10);
  if (*end || errno == ERANGE || v < 0) return -1;
  *out = v;
  return 0;
}

const char *notify_disconnect_check(int64_t code, const char *reason, int64_t retry_ms) {
  if (!(code == 1000 || code == 1001 || code == 1008 || code == 1011 || code == 1012 ||
        code == 1013 || (code >= 3000 && code <= 4999)))
    return "code must be 1000, 1001, 1008, 1011, 1012, 1013 or 3000 to 4999";
  int printable = reason != NULL;
  for (const char *p = reason; p && *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f) printable = 0;
  if (!printable || strlen(reason) > 80)
    return "reason must be a string of at most 80 bytes without control characters";
  if (retry_ms < 0 || retry_ms > 3600000)
    return "retryAfterMs must be an integer from 0 to 3600000";
  return NULL;
}

char *notify_user_disconnect(const char *origin, const char *user, int code, int64_t retry_ms,
                             const char *reason) {
  char *out = NULL;
  if (!util_id_valid(origin) || !util_id_valid(user) ||
      notify_disconnect_check(code, reason, retry_ms))
    return NULL;
  if (asprintf(&out, "u d %s %s %d %lld\n%s", origin, user, code, (long long)retry_ms, reason) < 0)
    out = NULL;
  return out;
}

char *notify_user_unsubscribe(const char *origin, const char *user, const char *conv) {
  char *out = NULL;
  if (!util_id_valid(origin) || !util_id_valid(user) || !util_id_valid(conv)) return NULL;
  if (asprintf(&out, "u u %s %s %s", origin, user, conv) < 0) out = NULL;
  return out;
}

char *notify_presence(int join, const char *conv, const char *client, int edge, const char *user) {
  char *out = NULL;
  if (!util_id_valid(conv) || !util_id_valid(client) || !util_id_valid(user)) return NULL;
  if (asprintf(&out, "p %c %s %s %d %s", join ? 'j' : 'l', conv, client, edge != 0, user) < 0)
    out = NULL;
  return out;
}

char *notify_signal(const char *conv, int64_t ts_ms, const char *sender, const char *body) {
  char *out = NULL;
  if (!util_id_valid(conv) || !util_id_valid(sender) || !body || !*body || ts_ms < 0) return NULL;
  if (asprintf(&out, "s %s %lld %s\n%s", conv, (long long)ts_ms, sender, body) < 0) return NULL;
  if (strlen(out) > STORE_NOTIFY_PAYLOAD_MAX) {
    free(out);
    return NULL;
  }
  return out;
}

/* "p j|l CONV CLIENT EDGE USER" */
static notify_kind_t decode_presence(const char *payload, notify_t *out) {
  const char *p = payload + 4;
  char action = payload[2];
  int64_t edge;
  if ((action != 'j' && action != 'l') || payload[3] != ' ') return NOTIFY_BAD;
  if (field(&p, out->conv, sizeof out->conv, 0) != 0 || !util_id_valid(out->conv) || *p++ != ' ' ||
      field(&p, out->client, sizeof out->client, 0) != 0 || !util_id_valid(out->client) ||
      *p++ != ' ' || number(&p, &edge) != 0 || edge > 1 || *p++ != ' ' ||
      field(&p, out->user, sizeof out->user, 1) != 0 || !util_id_valid(out->user) || *p != '\0')
    return NOTIFY_BAD;
  out->edge = (int)edge;
  return out->kind = action == 'j' ? NOTIFY_PRESENCE_JOIN : NOTIFY_PRESENCE_LEAVE;
}

/* "s CONV TS SENDER\nBODY" */
static notify_kind_t decode_signal(const char *payload, notify_t *out) {
  const char *p = payload + 2;
  if (field(&p, out->conv, sizeof out->conv, 0) != 0 || !util_id_valid(out->conv) || *p++ != ' ' ||
      number(&p, &out->ts_ms) != 0 || *p++ != ' ' ||
      field(&p, out->sender, sizeof out->sender, 1) != 0 || !util_id_valid(out->sender) ||
      *p++ != '\n' || *p == '\0')
    return NOTIFY_BAD;
  out->body = p;
  return out->kind = NOTIFY_SIGNAL;
}

static notify_kind_t decode_user(const char *payload, notify_t *out) {
  const char *p = payload + 4;
  char action = payload[2];
  if ((action != 'd' && action != 'u') || payload[3] != ' ') return NOTIFY_BAD;
  if (field(&p, out->origin, sizeof out->origin, 0) != 0 || !util_id_valid(out->origin) ||
      *p++ != ' ' || field(&p, out->user, sizeof out->user, 0) != 0 || !util_id_valid(out->user))
    return NOTIFY_BAD;
  if (action == 'u') {
    if (*p++ != ' ' || field(&p, out->conv, sizeof out->conv, 1) != 0 ||
        !util_id_valid(out->conv) || *p != '\0')
      return NOTIFY_BAD;
    return out->kind = NOTIFY_USER_UNSUBSCRIBE;
  }
  int64_t code;
  if (*p++ != ' ' || number(&p, &code) != 0 || *p++ != ' ' || number(&p, &out->retry_ms) != 0 ||
      *p != '\n' || notify_disconnect_check(code, p + 1, out->retry_ms))
    return NOTIFY_BAD; /* what POST /admin/users/{user}/disconnect accepts, and nothing else */
  out->code = (int)code;
  out->reason = p + 1;
  return out->kind = NOTIFY_USER_DISCONNECT;
}

notify_kind_t notify_decode(const char *payload, notify_t *out) {
  memset(out, 0, sizeof *out);
  const char *p = payload + 2;
  if (payload[0] == 'u' && payload[1] == ' ' && payload[2]) return decode_user(payload, out);
  if (payload[0] == 'p' && payload[1] == ' ' && payload[2]) return decode_presence(payload, out);
  if (payload[0] == 's' && payload[1] == ' ') return decode_signal(payload, out);
  if (payload[0] == 'c' && payload[1] == ' ' && (payload[2] == '0' || payload[2] == '1') &&
      payload[3] == ' ' && util_id_valid(payload + 4) && strlen(payload + 4) <= STORE_ID_MAX) {
    out->active = payload[2] == '1';
    strcpy(out->conv, payload + 4);
    return out->kind = NOTIFY_CHANNEL;
  }
  if (payload[0] != 'm' || payload[1] != ' ') return NOTIFY_BAD;
  if (number(&p, &out->seq) != 0 || out->seq < 1 || *p++ != ' ') return NOTIFY_BAD;
  if (field(&p, out->conv, sizeof out->conv, 0) != 0 || !util_id_valid(out->conv))
    return NOTIFY_BAD;
  if (*p == '\0') return out->kind = NOTIFY_HINT; /* "m SEQ CONV": a hint, epoch unknown */
  if (*p == '\n') {                               /* an earlier version's frame */
    out->body = p + 1;
    return out->kind = NOTIFY_FRAME;
  }
  if (*p++ != ' ' || field(&p, out->epoch, sizeof out->epoch, 0) != 0 || !util_id_valid(out->epoch))
    return NOTIFY_BAD;
  if (*p == '\0') return out->kind = NOTIFY_HINT;
  if (*p == '\n') {
    out->body = p + 1;
    return out->kind = NOTIFY_FRAME;
  }
  if (*p++ != ' ' || number(&p, &out->ts_ms) != 0 || *p++ != ' ' ||
      field(&p, out->id, sizeof out->id, 0) != 0 || !util_id_valid(out->id) || *p++ != ' ' ||
      field(&p, out->sender, sizeof out->sender, 1) != 0 || !util_id_valid(out->sender) ||
      *p++ != '\n')
    return NOTIFY_BAD;
  out->body = p;
  return out->kind = NOTIFY_MESSAGE;
}

int notify_is_batch(const char *payload) { return payload[0] == 'b' && payload[1] == '\n'; }

int notify_batch_next(const char **p, char *buf, size_t cap) {
  const char *s = *p;
  if (*s == '\0') return 0;
  size_t len = 0;
  int digits = 0;
  for (; *s >= '0' && *s <= '9' && digits < 6; s++, digits++) len = len * 10 + (size_t)(*s - '0');
  if (digits == 0 || *s != ' ' || len == 0 || len >= cap) return -1;
  s++;
  if (strnlen(s, len) < len) return -1;
  memcpy(buf, s, len);
  buf[len] = '\0';
  *p = s + len;
  return 1;
}
